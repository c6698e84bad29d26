"""One of the two CPU processes of test_distributed.py's jax.distributed test (not collected by pytest).

    python two_process_worker.py PROCESS_ID PORT CHECKPOINT_DIR WORK_DIR

Each process owns 2 CPU devices; together they form a 4-device mesh (data 1 x fsdp 2 x tensor 2). The
process starts jax.distributed through `searchjax.distributed.initialize` (config fields), loads the
checkpoint sharded across both processes while counting the elements it reads from the safetensors file,
scores WORK_DIR/batch.npz, gathers uneven host arrays, builds a global batch from process-local rows,
and writes WORK_DIR/result<PROCESS_ID>.npz + .json.
"""

import json
import os
import sys


def main():
    process_id, port, checkpoint, work_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    import jax
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 2)
    from searchjax import distributed
    cfg = distributed.distributed_config()
    cfg.enabled = True
    cfg.coordinator_address = f"127.0.0.1:{port}"
    cfg.num_processes = 2
    cfg.process_id = process_id
    assert distributed.initialize(cfg), "jax.distributed was already initialised"

    import numpy as np
    from searchjax import runtime
    from searchjax.models import checkpoint_io, load_pretrained
    from searchjax.scoring import token_logprobs
    from searchjax.sharding import batch_sharding, make_mesh, replicated
    runtime.enable_compilation_cache()

    elements_read: dict[str, int] = {}
    original_read = checkpoint_io.SafetensorsSource.read

    def counting_read(self, name, index):
        block = original_read(self, name, index)
        elements_read[name] = elements_read.get(name, 0) + int(np.asarray(block).size)
        return block
    checkpoint_io.SafetensorsSource.read = counting_read

    mesh = make_mesh(data=1, fsdp=2, tensor=2)
    model, params = load_pretrained(checkpoint, mesh=mesh)
    batch = np.load(os.path.join(work_dir, "batch.npz"))
    logprobs = distributed.to_host(token_logprobs(model, params, batch["ids"], batch["mask"], vocab_chunk=64))
    gathered = distributed.allgather({"x": np.arange(process_id + 2) + 10 * process_id})["x"]
    # A global batch from process-local rows: process p contributes rows [[p, p, p], [p + 10, ...]].
    local_rows = np.array([[process_id] * 3, [process_id + 10] * 3], np.float32)
    rows = distributed.global_batch(local_rows, batch_sharding(mesh))
    row_sums = distributed.to_host(jax.jit(lambda x: x.sum(axis=1), out_shardings=replicated(mesh))(rows))
    up = params["layers"]["mlp"]["up_proj"]["kernel"]
    np.savez(os.path.join(work_dir, f"result{process_id}.npz"), logprobs=logprobs, gathered=gathered,
             row_sums=row_sums, global_rows_shape=np.array(rows.shape))
    with open(os.path.join(work_dir, f"result{process_id}.json"), "w") as f:
        json.dump(dict(process_count=jax.process_count(), device_count=jax.device_count(),
                       local_device_count=jax.local_device_count(), up_proj_spec=list(up.sharding.spec),
                       up_proj_addressable=up.is_fully_addressable, elements_read=elements_read), f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
