"""The chat engine's scheduler: which sequences wait and run, who is admitted into the batch
when a slot frees, what a cancelled or failed sequence leaves behind, and which admitted prompts
share a prefill run. Plain Python: the graph is behind the `StepRunner` it drives, so this
module loads no ONNX Runtime and is tested with a fake runner.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from deployments.errors import InternalServerError

if TYPE_CHECKING:
    from deployments.contracts.outputs import GenerationChunk
    from deployments.errors import ServingError
    from deployments.observability.timings import InferenceTimings

# Batched prefill (see `prefill_groups`).
PREFILL_MAX_PADDED_TOKENS = 512
PREFILL_MIN_FILL = 0.75


class ScheduledSequence(Protocol):
    """What the scheduler reads and writes of a sequence (`sequence.SequenceState` in the
    engine): whether it finished or its consumer left, its admission time and its consumer's
    queue, which gets the error when its step fails."""

    finished: bool
    cancelled: bool
    timings: InferenceTimings
    queue: asyncio.Queue[GenerationChunk | ServingError]


S = TypeVar("S", bound=ScheduledSequence)


class StepRunner(Protocol[S]):
    """Runs the batch's steps (`step_runner.DecoderStepRunner` for the plain graph,
    `slot_step_runner.SlotStepRunner` for the slot-cache one): the seam between deciding who is
    in the batch and computing their next tokens."""

    async def run(
        self, admitted: list[S], running: list[S], keeps_batch: Callable[[list[S]], bool]
    ) -> None:
        """Prefill `admitted`, step `running + admitted` once, then step the same batch again
        and again while `keeps_batch(batch)` holds. Each step's chunks reach each sequence's
        queue; a sequence is `finished` after its last chunk."""
        ...


class Scheduler(Generic[S]):
    """The engine's queues and its loop on the event loop: sequences wait in arrival order,
    are admitted while the batch has room, and leave it when finished or cancelled; the loop
    runs while anything waits or runs and hands each batch to the step runner."""

    def __init__(self, runner: StepRunner[S], max_batch_size: int):
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self.runner = runner
        self.max_batch_size = max_batch_size
        self.waiting: deque[S] = deque()
        self.running: list[S] = []
        self._loop_task: asyncio.Task[None] | None = None

    @property
    def idle(self) -> bool:
        """Nothing left to step: every submitted sequence finished, failed or was cancelled."""
        return self._loop_task is None or self._loop_task.done()

    def submit(self, sequences: Sequence[S]) -> None:
        """Queue the sequences behind those already waiting and start the loop if it stopped."""
        self.waiting.extend(sequences)
        if self.idle:
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    @staticmethod
    def cancel(sequences: Sequence[S]) -> None:
        """The consumer left: the sequences leave the queue or the batch before the next
        admission, freeing their slots."""
        for seq in sequences:
            seq.cancelled = True

    def admit(self) -> list[S]:
        """Drop the cancelled from the batch and admit waiting sequences, oldest first, while
        it has room; the cancelled among the waiting are dropped on the way."""
        self.running = [s for s in self.running if not s.cancelled]
        admitted: list[S] = []
        while self.waiting and len(self.running) + len(admitted) < self.max_batch_size:
            seq = self.waiting.popleft()
            if not seq.cancelled:
                seq.timings.admitted()
                admitted.append(seq)
        return admitted

    def keeps_batch(self, batch: list[S]) -> bool:
        """Whether the runner may step this batch again without asking: nobody in it finished
        or was cancelled, and nobody waits for a slot it has free. Read from the runner's
        thread between steps."""
        return not any(s.finished or s.cancelled for s in batch) and not (
            self.waiting and len(batch) < self.max_batch_size
        )

    async def _run(self) -> None:
        while self.waiting or self.running:
            admitted = self.admit()
            batch = self.running + admitted
            if not batch:
                continue
            try:
                await self.runner.run(admitted, self.running, self.keeps_batch)
            except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the engine
                error = InternalServerError(f"generation failed: {type(exc).__name__}")
                for seq in batch:
                    if not seq.finished:
                        seq.finished = True
                        seq.queue.put_nowait(error)
                self.running = []
                continue
            self.running = [s for s in batch if not s.finished and not s.cancelled]


def prefill_runs(
    prompt_lengths: Sequence[int], cached_lengths: Sequence[int | None]
) -> list[list[int]]:
    """Which admitted prompts (by index) share a prefill run. Those with a cached start
    (`cached_lengths[i]`, None: none) run on it, one run per cached length and rest length, in
    order of first admission; the others several to a run (`prefill_groups`), after them."""
    on_cached: dict[tuple[int, int], list[int]] = {}
    fresh: list[int] = []
    for i, (length, cached) in enumerate(zip(prompt_lengths, cached_lengths, strict=True)):
        if cached is None:
            fresh.append(i)
        else:
            on_cached.setdefault((cached, length - cached), []).append(i)
    fresh_runs = prefill_groups([prompt_lengths[i] for i in fresh])
    return list(on_cached.values()) + [[fresh[j] for j in group] for group in fresh_runs]


def prefill_groups(lengths: Sequence[int]) -> list[list[int]]:
    """Which prompts (by index, each group in index order) share a prefill run. Shortest first,
    a prompt joins the group before it while the padded run stays within
    PREFILL_MAX_PADDED_TOKENS and at least PREFILL_MIN_FILL of it is real tokens. One run saves
    each further prompt a run's fixed cost, but padding costs like tokens and attention grows
    with the square of the longest prompt. Measured on the default tiny GLM, one run vs one per
    prompt: 8 x 18 tokens 1.0 vs 2.0 ms, 8 x 64 3.4 vs 4.2 ms, 8 x 100 6.2 vs 6.1 ms,
    4 x 256 10.0 vs 8.1 ms, 20 + 200 tokens 3.4 vs 2.0 ms."""
    groups: list[list[int]] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        padded = (len(groups[-1]) + 1) * lengths[i] if groups else 0
        if (
            groups
            and padded <= PREFILL_MAX_PADDED_TOKENS
            and real + lengths[i] >= PREFILL_MIN_FILL * padded
        ):
            groups[-1].append(i)
            real += lengths[i]
        else:
            groups.append([i])
            real = lengths[i]
    return [sorted(group) for group in groups]
