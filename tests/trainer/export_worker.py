"""One of the two CPU processes of test_hf_export.py's multi-host export (not collected by pytest).

    python export_worker.py PROCESS_ID PORT CHECKPOINT_DIR EXPORT_DIR RESULT_DIR

Each process owns 2 CPU devices; together they form a 4-device mesh (data 1 x fsdp 2 x tensor 2), so most
parameters are split across the two processes. Both load CHECKPOINT_DIR sharded, call
`searchjax.rl.checkpoint.export_hf` (the weights are gathered; process 0 writes), and record in
RESULT_DIR/process<ID>.json how many parameters were not fully addressable and whether the export was
complete when the call returned.
"""

import json
import os
import sys


def main():
    process_id, port, checkpoint, export_dir, result_dir = (int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4],
                                                            sys.argv[5])
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

    from searchjax.models import load_pretrained
    from searchjax.rl.checkpoint import export_hf
    from searchjax.sharding import make_mesh
    from searchjax.tokenization import load_tokenizer
    mesh = make_mesh(data=1, fsdp=2, tensor=2)
    model, params = load_pretrained(checkpoint, mesh=mesh)
    split = sum(not x.is_fully_addressable for x in jax.tree.leaves(params))
    export_hf(model, params, export_dir, tokenizer=load_tokenizer(checkpoint))
    complete = all(os.path.exists(os.path.join(export_dir, f))
                   for f in ("model.safetensors", "config.json", "tokenizer.json", "generation_config.json"))
    with open(os.path.join(result_dir, f"process{process_id}.json"), "w") as f:
        json.dump({"process_index": jax.process_index(), "process_count": jax.process_count(), "split": split,
                   "leaves": len(jax.tree.leaves(params)), "complete_on_return": complete}, f)


if __name__ == "__main__":
    main()
