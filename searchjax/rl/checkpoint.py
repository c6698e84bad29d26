"""Training checkpoints: orbax CheckpointManager (keep N, atomic), exact resume, optional HF export.

A checkpoint at step n is one orbax step directory holding two items:

    state   the TrainState pytree (master params, optimizer state, step, skipped, reference params),
            restored straight into the target shardings (each process reads only its shards)
    loop    JSON: everything else the host loop needs to continue bit for bit - the PRNG key data, the
            data position (next prompt index into the epoch's order, epoch), the step

Orbax writes each step into a temporary directory and renames it when complete, so a run killed
mid-save leaves the previous checkpoint intact; `max_to_keep` bounds the number kept. Saves are
synchronous: the train state is donated to the next update, so its buffers must be written before the
update may reuse them.

`export_hf` writes the policy as an HF model directory in the model's param dtype, in the layout
transformers' `from_pretrained` and vLLM read: config.json (architectures, model_type) and model.safetensors
(or shards + model.safetensors.index.json) from `searchjax.models.save_pretrained`; with the run's
tokenizer, tokenizer.json + tokenizer_config.json (chat template inside) from
`searchjax.tokenization.save_tokenizer`; generation_config.json (bos / eos / pad ids, every eos the
tokenizer stops on). The directory is assembled under a temporary name and renamed when complete, so
a reader never sees half an export.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp

STATE_ITEM = "state"
LOOP_ITEM = "loop"


def make_manager(directory: str | os.PathLike, *, max_to_keep: int) -> ocp.CheckpointManager:
    """A CheckpointManager over `directory` (created if missing) keeping the newest `max_to_keep` steps."""
    if max_to_keep < 1:
        raise ValueError(f"checkpoint.max_to_keep must be >= 1, got {max_to_keep}")
    directory = pathlib.Path(directory).absolute()
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=False)
    return ocp.CheckpointManager(directory, options=options, item_names=(STATE_ITEM, LOOP_ITEM))


def save(manager: ocp.CheckpointManager, step: int, state: Any, loop_state: dict) -> None:
    """Write (state, loop_state) as checkpoint `step`; no-op if that step is already saved."""
    if step in manager.all_steps():
        return
    manager.save(step, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardSave(state),
                                                  LOOP_ITEM: ocp.args.JsonSave(loop_state)}))
    manager.wait_until_finished()


def latest_step(manager: ocp.CheckpointManager) -> int | None:
    return manager.latest_step()


def abstract_like(state: Any, shardings: Any = None) -> Any:
    """ShapeDtypeStructs of `state` (arrays or ShapeDtypeStructs), placed by `shardings` when given."""
    if shardings is None:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
                            state)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)


def restore(manager: ocp.CheckpointManager, abstract_state: Any, step: int | None = None) -> tuple[Any, dict, int]:
    """(state, loop_state, step) of checkpoint `step` (default: the latest), state laid out as abstract_state."""
    step = manager.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no checkpoint to resume from in {manager.directory}")
    restored = manager.restore(step, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardRestore(abstract_state),
                                                                 LOOP_ITEM: ocp.args.JsonRestore()}))
    return restored[STATE_ITEM], dict(restored[LOOP_ITEM]), step


def restore_params(directory: str | os.PathLike, abstract_params: Any, step: int | None = None) -> tuple[Any, int]:
    """(policy master params, step) of checkpoint `step` (default: the latest) under `directory`.

    Reads only the state's "params" subtree (orbax partial restore): no optimizer moments or reference
    are loaded, so evaluating a checkpoint costs one model's memory. abstract_params: ShapeDtypeStructs (or
    arrays) of the params' structure; the stored dtype is kept (e.g. float32 master weights).
    """
    directory = pathlib.Path(directory).absolute()
    manager = ocp.CheckpointManager(directory, item_names=(STATE_ITEM, LOOP_ITEM))
    try:
        step = manager.latest_step() if step is None else step
        if step is None or step not in manager.all_steps():
            raise FileNotFoundError(f"{directory}: no checkpoint {'' if step is None else step} "
                                    f"(steps: {list(manager.all_steps())})")
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
                              abstract_params)
        restored = manager.restore(step, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.PyTreeRestore(
            item={"params": target}, restore_args={"params": jax.tree.map(_restore_arg, target)},
            partial_restore=True)}))
    finally:
        manager.close()
    return restored[STATE_ITEM]["params"], step


def _restore_arg(x: jax.ShapeDtypeStruct) -> ocp.ArrayRestoreArgs:
    sharding = x.sharding or jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return ocp.ArrayRestoreArgs(sharding=sharding, global_shape=x.shape)


def generation_config(model_config, tokenizer=None) -> dict:
    """generation_config.json: the ids generation needs (sampling settings are left to the caller)."""
    eos = list(dict.fromkeys([*model_config.eos_token_ids, *(tokenizer.eos_token_ids if tokenizer else ())]))
    pad = tokenizer.pad_token_id if tokenizer is not None else model_config.pad_token_id
    return {"bos_token_id": model_config.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else eos,
            "pad_token_id": pad}


def export_hf(model, params: Any, directory: str | os.PathLike, *, tokenizer=None) -> pathlib.Path:
    """The policy (and its tokenizer) as an HF model directory (module docstring). Every process must call
    it: the weights are gathered from all of them; process 0 writes."""
    import json
    import shutil
    from searchjax.models import save_pretrained
    from searchjax.rl.trainer import cast_tree
    directory = pathlib.Path(directory).absolute()
    staging = directory.with_name(directory.name + ".partial")
    writer = jax.process_index() == 0
    if writer and staging.exists():
        shutil.rmtree(staging)  # a previous export killed half way
    save_pretrained(model, cast_tree(params, model.config.weight_dtype), staging)
    if writer:
        if tokenizer is not None:
            from searchjax.tokenization import save_tokenizer
            save_tokenizer(tokenizer, staging, model_max_length=model.config.max_position_embeddings)
        (staging / "generation_config.json").write_text(json.dumps(generation_config(model.config, tokenizer),
                                                                   indent=2) + "\n")
        if directory.exists():  # the same step exported again (a resumed run re-running it)
            shutil.rmtree(directory)
        os.replace(staging, directory)
    if jax.process_count() > 1:  # the others return once the directory is complete
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(f"export_hf {directory}")
    return directory
