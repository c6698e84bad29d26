"""Multi-host plumbing: jax.distributed start-up from config fields, global batches, host gathers.

Multi-host model (docs/architecture.md, "Multi-host"): every process runs the same program and its own host loop on a disjoint
shard of the prompts (`process_shard`); a GRPO group never spans processes. Tensors that feed jitted
steps are *global* arrays: a process contributes its local rows with `global_batch`
(jax.make_array_from_process_local_data), and parameters are read slice by slice by
`load_pretrained(path, mesh=...)`. Host values that must be seen whole (HRPO's (reward, hop) pairs,
whose hop groups span the batch, Dr.Free eq. 9) are gathered with `allgather`.

Preemption (`watch_preemption`): a scheduler's SIGTERM reaches one host, often not the others. A checkpoint
save is a collective, so a host that saved alone would wait forever for the others; every process must decide
to stop at the same step. With several processes the decision is JAX's preemption sync point
(`multihost_utils.reached_preemption_sync_point`): `jax.distributed.initialize` starts a preemption notifier
that owns SIGTERM (no Python handler may replace it), the notice is shared through the coordination service,
and every process learns the same step at which to save (the largest step any process had reached, plus one).
One process: a Python SIGTERM handler sets a flag, read at the end of the step.

Config fields (`distributed_config()`, embed it as `config.distributed`):
    enabled              bool   call jax.distributed.initialize at start-up
    coordinator_address  str    "host:port" of process 0; "" = let JAX detect the cluster (TPU pods,
                                SLURM, Open MPI), in which case num_processes/process_id are detected too
    num_processes        int    total processes (-1 = detect)
    process_id           int    this process (-1 = detect)
    local_device_ids     str    comma-separated local device ids this process uses ("" = all)
    cpu_collectives      str    CPU cross-process collectives ("gloo", JAX's default; "mpi" needs
                                libmpitrampoline); only matters for CPU-only runs such as the tests
"""

from __future__ import annotations

import signal
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding


def distributed_config():
    """ml_collections.ConfigDict with the fields above, single-process by default."""
    import ml_collections
    return ml_collections.ConfigDict(dict(
        enabled=False,  # True on multi-host runs: start jax.distributed before any other JAX call
        coordinator_address="",  # "host:port" of process 0; "" = auto-detect (TPU pod / SLURM / MPI)
        num_processes=-1,  # total processes; -1 = auto-detect
        process_id=-1,  # this process's rank; -1 = auto-detect
        local_device_ids="",  # e.g. "0,1" to bind this process to two local GPUs; "" = all
        cpu_collectives="gloo",  # cross-process collectives on CPU backends
    ))


def initialize(cfg) -> bool:
    """Start jax.distributed from `cfg` (see `distributed_config`); returns True if it was started.

    Must run before anything touches a JAX backend. A no-op when `cfg.enabled` is false or when
    jax.distributed is already initialised (e.g. a notebook re-running its first cell).
    """
    if not cfg.enabled:
        return False
    if jax.distributed.is_initialized():
        return False
    jax.config.update("jax_cpu_collectives_implementation", cfg.cpu_collectives)
    kwargs: dict[str, Any] = {}
    if cfg.coordinator_address:
        if cfg.num_processes < 1 or cfg.process_id < 0:
            raise ValueError("distributed.coordinator_address is set, so distributed.num_processes (>= 1) and "
                             f"distributed.process_id (>= 0) must be too; got {cfg.num_processes}, {cfg.process_id}")
        if cfg.process_id >= cfg.num_processes:
            raise ValueError(f"distributed.process_id={cfg.process_id} >= distributed.num_processes="
                             f"{cfg.num_processes}")
        kwargs.update(coordinator_address=cfg.coordinator_address, num_processes=cfg.num_processes,
                      process_id=cfg.process_id)
    if cfg.local_device_ids:
        kwargs["local_device_ids"] = [int(i) for i in str(cfg.local_device_ids).split(",")]
    jax.distributed.initialize(**kwargs)
    return True


def process_shard(items: Sequence[Any], process_index: int | None = None,
                  process_count: int | None = None) -> list[Any]:
    """This process's contiguous, disjoint share of `items` (sizes differ by at most one).

    Contiguous so that prompt groups laid out consecutively stay on one process.
    """
    index = jax.process_index() if process_index is None else process_index
    count = jax.process_count() if process_count is None else process_count
    bounds = np.linspace(0, len(items), count + 1).round().astype(int)
    return list(items[bounds[index]:bounds[index + 1]])


def global_batch(local: Any, sharding: NamedSharding) -> Any:
    """Global jax.Arrays from each process's local rows: leading dims concatenated across processes.

    `local` is a pytree of numpy arrays [B_local, ...]; every process must pass the same B_local.
    The result has B = B_local * process_count rows laid out by `sharding` (e.g. `batch_sharding(mesh)`),
    without any process sending its rows to another.
    """
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local)


def to_host(x: jax.Array) -> np.ndarray:
    """numpy value of a global array on every process (gathers shards held by other processes)."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def allgather(local: Any) -> Any:
    """Concatenate each process's host values along axis 0 (a pytree of numpy arrays).

    Used by HRPO: hop groups span the whole batch, so (reward, hop) pairs from every process are
    gathered before `hrpo_advantages` normalises them; each process then keeps its own slice
    (`process_shard` bounds). Leading sizes may differ between processes (uneven `process_shard`s);
    trailing dims must agree. Result is in process order. Single-process: identity.
    """
    local = jax.tree.map(np.asarray, local)
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils
    leaves, treedef = jax.tree.flatten(local)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([len(x) for x in leaves], np.int64)))
    sizes = sizes.reshape(jax.process_count(), len(leaves))
    longest = sizes.max(axis=0)
    padded = [np.concatenate([x, np.zeros((m - len(x),) + x.shape[1:], x.dtype)]) for x, m in zip(leaves, longest)]
    gathered = multihost_utils.process_allgather(padded)  # each [process_count, longest, ...]
    out = [np.concatenate([np.asarray(g)[p, :sizes[p, i]] for p in range(jax.process_count())])
           for i, g in enumerate(gathered)]
    return jax.tree.unflatten(treedef, out)


def _sync_manager_running() -> bool:
    """True when jax.distributed runs with its preemption sync manager (the default: jax_enable_preemption_service)."""
    from jax._src import distributed as jax_distributed  # the state object; the public API has no accessor
    state = jax_distributed.global_state
    return state.client is not None and state.preemption_sync_manager is not None


def watch_preemption() -> tuple[Callable[[int], bool], Callable[[], None]]:
    """(preempted(step) -> bool, restore()): whether the run must save and stop after `step`, the same answer on
    every process (module docstring, "Preemption"); restore() puts back what was changed. Call preempted() once
    per step on every process, with the same step numbers (a collective when there are several processes).

    * several processes, JAX's preemption service on: reached_preemption_sync_point(step); SIGTERM is left to
      the notifier jax.distributed installed (a Python handler would take the signal away from it);
    * several processes, the service off: a Python flag per process, OR-ed over processes every step;
    * one process: the Python flag. Off the main thread no handler can be installed: never preempted.
    """
    if jax.process_count() > 1 and _sync_manager_running():
        from jax.experimental import multihost_utils
        return multihost_utils.reached_preemption_sync_point, lambda: None
    flag = {"stop": False}
    try:
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: flag.update(stop=True))
    except ValueError:  # not the main thread
        return (lambda step: False), (lambda: None)

    def preempted(step: int) -> bool:
        if jax.process_count() == 1:
            return flag["stop"]
        return bool(np.any(allgather(np.asarray([flag["stop"]], bool))))

    return preempted, lambda: signal.signal(signal.SIGTERM, previous)
