"""Training batches made in DataLoader worker processes, in an order that depends on the run's seed and the epoch
alone, and resumed exactly mid-epoch (`ResumableLoader`): from a data set read whole (`IndexSource`) or from a stream
(`StreamSource`: `datasets` streaming, split between the processes by `split_dataset_by_node`).

An epoch is a sequence of units: a few raw examples each (the undecoded image bytes or path, the text), as the source
gives them in order. Unit i becomes its batches (`make_batches`: decode and augment the images, tokenize the texts,
cut a pool into token-budget batches) on worker i mod W, with a random state drawn from (seed, epoch, i) alone, and
the main process takes the units in order (torch's DataLoader returns its workers' results in the order it asked for
them). So the batches of an epoch are the same with 0, 1 or 8 workers, and a run that stopped at unit u, batch j
starts its loader there: each worker reads the source from the start of the epoch, skipping the units before u
without making them (for a stream: reading the raw examples again, not decoding or tokenizing them), and drops the j
batches of unit u it makes again. That is the cost of an exact resume (the issue's "replay the epoch and skip"):
`datasets`' own `IterableDataset.state_dict()` does not keep the content of a shuffle buffer, so a stream resumed
from it reads other examples; replaying the epoch from its seed reads again what the epoch had read, and nothing else.
The raw examples of a stream are read by every worker of a process (each makes only its own units); the
examples are split between processes, each reading only its own part.
"""

from __future__ import annotations

import hashlib
import logging
import math
import pickle
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, get_worker_info

logger = logging.getLogger(__name__)

# Raw examples of a stream read at once (`IterableDataset.iter`) before they are grouped into units.
READ_BATCH = 256


def unit_seed(seed: int, epoch: int, unit: int) -> int:
    """The seed of unit `unit` of `epoch` (numpy's SeedSequence of the three): its augmentation and its batches'
    order depend on nothing else.

    Args:
        seed: the run's seed.
        epoch: the epoch.
        unit: the unit's index in the epoch.

    Returns:
        A seed in [0, 2**63).
    """
    return int(np.random.SeedSequence([seed, epoch, unit]).generate_state(1, dtype=np.uint64)[0] % (2**63))


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((str(key), _canonical(item)) for key, item in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_canonical(item) for item in value)
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    return value


def example_fingerprint(example: Mapping[str, Any]) -> bytes:
    """A digest of a raw example's values (its columns in sorted order; an image's bytes or path): the held-out
    examples of a stream are recognised by it, and so are their copies.

    Args:
        example: column -> value, as the stream gives it (images undecoded).

    Returns:
        12 bytes of BLAKE2b.
    """
    return hashlib.blake2b(pickle.dumps(_canonical(example), protocol=4), digest_size=12).digest()


def columns_of(rows: list[dict]) -> dict[str, list]:
    """Rows (column -> value) as columns (column -> values), as `Dataset.__getitem__` gives a batch."""
    return {key: [row[key] for row in rows] for key in rows[0]} if rows else {}


def rows_of(columns: Mapping[str, list]) -> Iterator[dict]:
    """Columns (column -> values) as rows."""
    names = list(columns)
    for values in zip(*(columns[name] for name in names)):
        yield dict(zip(names, values))


# ------------------------------------------------------------------------------------------------------ sources
class UnitSource(Protocol):
    """Where the units of an epoch come from: `refs(epoch)` gives each unit's reference in order (cheap to skip),
    `fetch(ref)` its raw examples as columns; `units_per_epoch` is None when not known in advance (a stream)."""

    units_per_epoch: int | None

    def refs(self, epoch: int) -> Iterator[Any]:
        """The references of the units of `epoch`, in order.

        Args:
            epoch: the epoch.

        Returns:
            An iterator of references.
        """
        ...

    def fetch(self, ref: Any) -> dict[str, list]:
        """The raw examples of the unit that `ref` names.

        Args:
            ref: a reference `refs` gave.

        Returns:
            Column -> values.
        """
        ...


class IndexSource:
    """The units of a data set read whole (a map-style `datasets.Dataset`, or anything indexed by a list of indices
    that returns columns): each epoch a permutation of the examples drawn from `seed + epoch` (as Accelerate's
    seedable sampler draws it), split between the processes.

    With `whole_batches` a unit is one batch of `unit_size` examples: global batch g (`unit_size` x processes
    examples of the permutation) gives process p its p-th slice, and an incomplete global batch at the end is dropped,
    so N processes see what one process sees with N times the batch. Without, a unit is a pool of up to `unit_size`
    of the process's examples (every N-th of the permutation), the last pool smaller: all the examples are used.

    Args:
        dataset: the examples; `dataset[indices]` gives their columns.
        seed: the run's seed.
        rank: this process's index.
        world_size: the processes.
        unit_size: examples per unit.
        whole_batches: whether a unit is one batch (see above).
    """

    def __init__(self, dataset, *, seed: int, rank: int, world_size: int, unit_size: int, whole_batches: bool):
        if unit_size < 1:
            raise ValueError(f"unit_size must be >= 1, got {unit_size!r}.")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank!r} is not one of the {world_size} processes.")
        self.dataset, self.seed, self.rank, self.world_size = dataset, seed, rank, world_size
        self.unit_size, self.whole_batches = unit_size, whole_batches
        examples = len(dataset)
        if whole_batches:
            self.units_per_epoch = examples // (unit_size * world_size)
        else:
            mine = len(range(rank, examples, world_size))
            self.units_per_epoch = math.ceil(mine / unit_size)

    def refs(self, epoch: int) -> Iterator[list[int]]:
        """This process's units of `epoch`: lists of indices.

        Args:
            epoch: the epoch (the permutation's seed is the run's seed plus it).

        Returns:
            An iterator of index lists.
        """
        generator = torch.Generator().manual_seed(self.seed + epoch)
        order = torch.randperm(len(self.dataset), generator=generator).tolist()
        size = self.unit_size
        if self.whole_batches:
            step = size * self.world_size
            for start in range(0, len(order) - step + 1, step):
                yield order[start + self.rank * size : start + (self.rank + 1) * size]
        else:
            mine = order[self.rank :: self.world_size]
            for start in range(0, len(mine), size):
                yield mine[start : start + size]

    def fetch(self, ref: list[int]) -> dict[str, list]:
        """The examples of a unit.

        Args:
            ref: its indices.

        Returns:
            Column -> values, as `Dataset.__getitem__` gives them.
        """
        return self.dataset[ref]


class StreamSource:
    """The units of a stream (a `datasets.IterableDataset`): the stream shuffled with the run's seed in a buffer of
    `buffer_size` examples (its shards too; `set_epoch` reshuffles them each epoch), this process's part of it
    (`datasets.distributed.split_dataset_by_node`: whole shards when they divide evenly between the processes, else
    every N-th example), cut into units of `unit_size` examples. Examples whose fingerprint is in `held_out` (the
    evaluation examples taken from the stream's head, `example_fingerprint`) are left out.

    Args:
        stream: the raw examples (images undecoded: `Image(decode=False)`).
        seed: the run's seed.
        buffer_size: the shuffle buffer (0: the stream's own order).
        rank: this process's index.
        world_size: the processes.
        unit_size: examples per unit.
        drop_last: drop an incomplete last unit (units that are whole batches); else keep it (pools).
        held_out: fingerprints of the examples to leave out.
    """

    units_per_epoch = None

    def __init__(self, stream, *, seed: int, buffer_size: int, rank: int, world_size: int, unit_size: int,
                 drop_last: bool, held_out: frozenset[bytes] = frozenset()):  # fmt: skip
        from datasets.distributed import split_dataset_by_node

        if unit_size < 1:
            raise ValueError(f"unit_size must be >= 1, got {unit_size!r}.")
        shuffled = stream.shuffle(seed=seed, buffer_size=buffer_size) if buffer_size > 0 else stream
        self.shards = stream.num_shards
        self.world_size = world_size
        self.stream = split_dataset_by_node(shuffled, rank=rank, world_size=world_size)
        self.unit_size, self.drop_last, self.held_out = unit_size, drop_last, held_out

    @property
    def split(self) -> str:
        """How the processes share the stream: "shards" or "examples" (as `split_dataset_by_node` decides)."""
        return "shards" if self.shards % self.world_size == 0 else "examples"

    def set_epoch(self, epoch: int) -> None:
        """Set the stream's epoch (`IterableDataset.set_epoch`: the shards' order and the buffer's draws) in this
        process. `ResumableLoader` calls it in the main process before its workers start: `datasets` keeps the epoch
        in shared memory and updates it by adding the difference, so two workers setting it at once could leave it
        one epoch ahead (the epoch read in another epoch's order); the workers then find it set and write nothing.

        Args:
            epoch: the epoch.
        """
        if self.stream.epoch != epoch:
            self.stream.set_epoch(epoch)

    def refs(self, epoch: int) -> Iterator[dict[str, list]]:
        """This process's units of `epoch`, read from the stream: their raw examples themselves.

        Args:
            epoch: the epoch (`IterableDataset.set_epoch`: the shards' order and the buffer's draws).

        Returns:
            An iterator of columns (column -> values).
        """
        self.set_epoch(epoch)  # a no-op in a worker when the main process has set it already (see `set_epoch`)
        rows: list[dict] = []
        # `iter`, not `__iter__`: inside a DataLoader worker `__iter__` would hand this worker only some shards
        for columns in self.stream.iter(batch_size=READ_BATCH):
            for row in rows_of(columns):
                if self.held_out and example_fingerprint(row) in self.held_out:
                    continue
                rows.append(row)
                if len(rows) == self.unit_size:
                    yield columns_of(rows)
                    rows = []
        if rows and not self.drop_last:
            yield columns_of(rows)

    def fetch(self, ref: dict[str, list]) -> dict[str, list]:
        """A unit's raw examples (read already by `refs`).

        Args:
            ref: what `refs` gave.

        Returns:
            The same columns.
        """
        return ref


# ------------------------------------------------------------------------------------------------------- loader
MakeBatches = Callable[[dict[str, list], np.random.Generator], list[dict]]


class _Units(torch.utils.data.IterableDataset):
    """The units of the epoch that `position` ([epoch, first unit], in shared memory so that persistent workers read
    it) names, each made into its batches by the worker whose turn it is."""

    def __init__(self, source: UnitSource, make_batches: MakeBatches, seed: int, position: torch.Tensor):
        self.source, self.make_batches, self.seed, self.position = source, make_batches, seed, position

    def __iter__(self) -> Iterator[tuple[int, list[dict]]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch, start = (int(value) for value in self.position.tolist())
        for index, ref in enumerate(self.source.refs(epoch)):
            if index < start or (index - start) % workers != worker:
                continue
            seed = unit_seed(self.seed, epoch, index)
            with torch.random.fork_rng(devices=[]):  # the main process's own random state is left as it was
                torch.manual_seed(seed)
                batches = self.make_batches(self.source.fetch(ref), np.random.default_rng(seed))
            yield index, batches


class ResumableLoader:
    """Batches of a `UnitSource`, made by `make_batches` (columns of raw examples and a numpy generator -> a list of
    batches) in `num_workers` DataLoader workers, in an order that depends on (seed, epoch) alone; `state_dict` says
    where the next batch comes from and `load_state_dict` starts there (see the module's docstring).

    Args:
        source: the units.
        make_batches: a unit's raw examples -> its batches (picklable where workers are spawned).
        seed: the run's seed.
        num_workers: DataLoader worker processes (0: the main process makes the batches).
        pin_memory: copy batches to page-locked memory (faster transfers to an accelerator).
        persistent_workers: keep the workers between epochs.
        prefetch_factor: units each worker prepares ahead (None: torch's default).
        batches_per_epoch: the batches of an epoch when known (one batch per unit), else None.
    """

    def __init__(self, source: UnitSource, make_batches: MakeBatches, *, seed: int, num_workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = False, prefetch_factor: int | None = None,
                 batches_per_epoch: int | None = None):  # fmt: skip
        self.source = source
        self.position = torch.zeros(2, dtype=torch.int64).share_memory_()
        kwargs: dict[str, Any] = dict(batch_size=None, num_workers=num_workers, pin_memory=pin_memory)
        if num_workers:
            kwargs.update(persistent_workers=persistent_workers, prefetch_factor=prefetch_factor)
        # its own generator: making an iterator draws the workers' base seed from it, not from the global random
        # state that dropout reads (a resumed run would otherwise draw it at another point of that state)
        kwargs["generator"] = torch.Generator().manual_seed(seed)
        self.loader = DataLoader(_Units(source, make_batches, seed, self.position), **kwargs)
        self.batches_per_epoch = batches_per_epoch
        self.epoch = 0
        self.next_unit = 0  # where the next batch comes from: unit, and batch within it
        self.next_batch = 0

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` from its beginning (unless it is the epoch a loaded state stands in)."""
        if epoch != self.epoch:
            self.epoch, self.next_unit, self.next_batch = epoch, 0, 0

    def __len__(self) -> int:
        if self.batches_per_epoch is None:
            raise TypeError(
                "The batches of an epoch of this loader are not known in advance (a stream, a token budget)."
            )
        return self.batches_per_epoch

    def __iter__(self) -> Iterator[dict]:
        start, skip = self.next_unit, self.next_batch
        self.position[0], self.position[1] = self.epoch, start
        set_epoch = getattr(self.source, "set_epoch", None)
        if set_epoch is not None:  # before the workers read it (see `StreamSource.set_epoch`)
            set_epoch(self.epoch)
        for index, batches in self.loader:
            for number in range(skip if index == start else 0, len(batches)):
                if number + 1 < len(batches):
                    self.next_unit, self.next_batch = index, number + 1
                else:
                    self.next_unit, self.next_batch = index + 1, 0
                yield batches[number]

    def state_dict(self) -> dict[str, int]:
        """Where the next batch comes from: {"epoch", "unit", "batch"} (the batch within the unit)."""
        return {"epoch": self.epoch, "unit": self.next_unit, "batch": self.next_batch}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Start the next iteration where `state` (from `state_dict`) stands.

        Args:
            state: {"epoch", "unit", "batch"}.

        Raises:
            ValueError: a state without those keys, or with negative values.
        """
        try:
            epoch, unit, batch = (int(state[key]) for key in ("epoch", "unit", "batch"))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"A loader state holds 'epoch', 'unit' and 'batch' integers, got {state!r}.") from error
        if min(epoch, unit, batch) < 0:
            raise ValueError(f"A loader state's positions are >= 0, got {dict(state)!r}.")
        self.epoch, self.next_unit, self.next_batch = epoch, unit, batch


# --------------------------------------------------------------------------------------------- token budgets
def token_budget_batches(lengths, budget: int, rng: np.random.Generator) -> list[list[int]]:
    """Batches of example indices under a token budget, as fairseq's `--max-tokens` makes them: the examples in a
    random order, then stably sorted by length (so batches hold examples of about one length: little padding), cut
    greedily so that a batch's examples times its longest stay within `budget` (the tokens of the padded batch), then
    the batches in a random order.

    Args:
        lengths: each example's length in tokens (for a pair: the longer of source and target).
        budget: the most tokens of a padded batch.
        rng: the generator of the two random orders.

    Returns:
        The batches, lists of indices into `lengths`.

    Raises:
        ValueError: an example longer than the budget.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and int(lengths.max()) > budget:
        longest = int(lengths.argmax())
        raise ValueError(f"Example {longest} has {int(lengths[longest])} tokens, more than the budget of {budget}.")
    order = rng.permutation(len(lengths))
    order = order[np.argsort(lengths[order], kind="stable")]
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in order.tolist():
        length = int(lengths[index])
        if current and (len(current) + 1) * max(longest, length) > budget:
            batches.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, length)
    if current:
        batches.append(current)
    return [batches[i] for i in rng.permutation(len(batches)).tolist()]


__all__ = [
    "READ_BATCH",
    "IndexSource",
    "MakeBatches",
    "ResumableLoader",
    "StreamSource",
    "UnitSource",
    "columns_of",
    "example_fingerprint",
    "rows_of",
    "token_budget_batches",
    "unit_seed",
]
