"""When a remote engine's step stops gathering the engine iteration's tokens (RemoteRunner._await).

No sockets: the runner reads a scripted stand-in for its streams, each poll
bringing the tokens the script says. The gather window here is a whole
second, so a step that waits it out is told apart from one that does not by
far more than a loaded machine's delays.
"""

from __future__ import annotations

import time

from fsched.core.runners.remote import Codec, RemoteRunner
from fsched.core.runners.standin import STANDIN_EOS, standin_text
from fsched.core.runners.streams import Stream
from fsched.core.sched.plan import Plan, PrefillChunk
from fsched.core.sched.request import Request
from fsched.core.types import SamplingParams

GATHER_S = 1.0
CODEC = Codec(standin_text, frozenset({STANDIN_EOS}), 8192)


class ScriptedStreams:
    """Streams whose polls bring what `script` lists: one {request id: tokens} per poll, then nothing;
    `wake_at`: the poll after which new work is announced (the wake descriptor turns readable during the
    wait that follows it; the polls after it see it)."""

    woken = False
    whole_iterations = False  # as HTTP streams: an iteration's tokens come stream by stream

    def __init__(self) -> None:
        self.script: list[dict[str, list[int]]] = []
        self.by_id: dict[str, Stream] = {}
        self.wake_at: int | None = None
        self.polls = 0

    def open(self, body: dict, owner, plain: bool = True) -> Stream:
        stream = Stream(sock=None, request=b"", owner=owner)
        self.by_id[owner.id] = stream
        return stream

    def abort(self, stream: Stream) -> None:
        stream.closed = True

    def wake_on(self, fd: int) -> None:
        pass

    def pause(self, timeout: float) -> bool:
        """As Streams.pause: a wait the wake descriptor ends (at once when it is readable already)."""
        if self.wake_at is not None and self.polls >= self.wake_at:
            self.woken = True
            return True
        time.sleep(timeout)
        return False

    def poll(self, timeout: float) -> list[Stream]:
        self.polls += 1
        self.woken = self.wake_at is not None and self.polls > self.wake_at
        news = self.script.pop(0) if self.script else {}
        for rid, tokens in news.items():
            self.by_id[rid].tokens += tokens
        return [self.by_id[rid] for rid in news]


class ScriptedClient:
    url = "http://scripted"

    def __init__(self) -> None:
        self.made = ScriptedStreams()

    def streams(self, path: str) -> ScriptedStreams:
        return self.made

    def healthy(self) -> bool:
        return True


def rig(*ids: str) -> tuple[RemoteRunner, ScriptedStreams, dict[str, Request]]:
    client = ScriptedClient()
    runner = RemoteRunner(client, CODEC, "m", max_wait_s=5.0, gather_s=GATHER_S, gather_slice_s=0.002)
    requests = {rid: Request.to_run(rid, [1, 2, 3], SamplingParams(max_tokens=50, temperature=0,
                                                                    ignore_eos=True)) for rid in ids}
    for request in requests.values():
        runner.add(request)
    return runner, client.made, requests


def timed(runner: RemoteRunner, plan: Plan):
    start = time.perf_counter()
    result = runner.run(plan)
    return result, time.perf_counter() - start


def start(runner: RemoteRunner, streams: ScriptedStreams, flowing: list[str]) -> None:
    """A first step that opens every stream and brings `flowing` their first token (the others none)."""
    streams.script = [{rid: [7] for rid in flowing}]
    runner.run(Plan(step=0, prefill=tuple(PrefillChunk(rid, 0, 3, True) for rid in runner._requests)))


def test_a_stream_that_has_sent_nothing_yet_is_not_waited_for():
    """`a` is mid-output, `b` opened and waits for the engine to take it in: the step reports `a`'s
    token without gathering for `b` (whose first token comes at an iteration of the engine's choosing;
    waiting for it held every step's tokens back the whole window)."""
    runner, streams, requests = rig("a", "b")
    start(runner, streams, flowing=["a"])
    assert requests["a"].output == [7] and requests["b"].output == []
    streams.script = [{"a": [8]}]
    result, took = timed(runner, Plan(step=1, decode=("a",), prefill=(PrefillChunk("b", 3, 0, True),)))
    assert result.outcome.produced == {"a": 1, "b": 0}
    assert took < GATHER_S / 2


def test_a_first_token_is_reported_in_the_step_it_arrives_in():
    """`b`'s first token comes while `a`'s token of the same iteration is still on its way: the step
    ends with `b`'s first token rather than gathering for `a`; `a`'s comes with the next step."""
    runner, streams, requests = rig("a", "b")
    start(runner, streams, flowing=["a"])
    streams.script = [{"b": [5]}]
    result, took = timed(runner, Plan(step=1, decode=("a",), prefill=(PrefillChunk("b", 3, 0, True),)))
    assert result.outcome.produced == {"a": 0, "b": 1} and requests["b"].output == [5]
    assert took < GATHER_S / 2
    streams.script = [{"a": [8], "b": [6]}]
    runner.run(Plan(step=2, decode=("a", "b")))
    assert requests["a"].output == [7, 8] and requests["b"].output == [5, 6]


def test_the_rest_of_an_iteration_is_still_gathered_from_the_streams_already_sending():
    """Streams mid-output are gathered: `c`'s token, a few polls behind `a`'s, comes in the same step."""
    runner, streams, requests = rig("a", "c")
    start(runner, streams, flowing=["a", "c"])
    streams.script = [{"a": [8]}, {}, {}, {"c": [9]}]
    result, took = timed(runner, Plan(step=1, decode=("a", "c")))
    assert result.outcome.produced == {"a": 1, "c": 1}
    assert took < GATHER_S / 2


def test_streams_that_bring_whole_iterations_are_not_gathered_from():
    """A transport whose poll brings an engine iteration's news for every stream at once (fsched's vLLM
    front: a line an iteration) has nothing more of it to gather: the step ends with what came, and a
    stream without news had none in that iteration."""
    runner, streams, requests = rig("a", "c")
    start(runner, streams, flowing=["a", "c"])
    streams.whole_iterations = True
    streams.script = [{"a": [8]}, {}, {}, {"c": [9]}]
    result, took = timed(runner, Plan(step=1, decode=("a", "c")))
    assert result.outcome.produced == {"a": 1, "c": 0}
    assert took < GATHER_S / 4 and streams.polls == 2  # the first step's, and this step's that brought a


def test_new_work_announced_during_the_gather_ends_it_without_waiting_out_the_slice():
    """`a`'s token came, `c`'s is still on its way, and new work is announced as the gather starts: the
    step ends at once with `a`'s token (the daemon claims the new work now); `c`'s comes next step. The
    gather's slice here is the whole window: a pause that does not watch the wake descriptor waits it
    out before it sees the announcement."""
    client = ScriptedClient()
    runner = RemoteRunner(client, CODEC, "m", max_wait_s=5.0, gather_s=GATHER_S, gather_slice_s=GATHER_S)
    requests = {rid: Request.to_run(rid, [1, 2, 3], SamplingParams(max_tokens=50, temperature=0,
                                                                    ignore_eos=True)) for rid in ("a", "c")}
    for request in requests.values():
        runner.add(request)
    streams = client.made
    start(runner, streams, flowing=["a", "c"])
    streams.script = [{"a": [8]}, {"c": [9]}]
    streams.wake_at = streams.polls + 1  # announced right after the poll that brings `a`'s token
    result, took = timed(runner, Plan(step=1, decode=("a", "c")))
    assert result.outcome.produced == {"a": 1, "c": 0}
    assert took < GATHER_S / 2
    streams.wake_at = None
    runner.run(Plan(step=2, decode=("a", "c")))
    assert requests["c"].output == [7, 9]


def test_a_wait_that_nothing_ended_does_not_gather():
    """Nothing arrives within the step's wait (an engine between iterations, slower than the wait): the
    step ends then, empty, rather than sleeping the gather's slices for streams that have sent nothing
    since; what comes next is read, and the rest of its iteration gathered, by the next step."""
    runner, streams, requests = rig("a", "c")
    runner.max_wait_s = 0.05
    start(runner, streams, flowing=["a", "c"])
    streams.script = []
    result, took = timed(runner, Plan(step=1, decode=("a", "c")))
    assert result.outcome.produced == {"a": 0, "c": 0}
    assert took < GATHER_S / 2
    streams.script = [{"a": [8]}, {}, {"c": [9]}]
    result, _ = timed(runner, Plan(step=2, decode=("a", "c")))
    assert result.outcome.produced == {"a": 1, "c": 1}


def test_a_burst_that_brought_most_streams_ends_after_a_quiet_spell():
    """Three of four streams sent their token of the iteration and then nothing comes: the step ends
    once nothing has arrived for the quiet spell (the fourth's token comes with a later iteration; vLLM
    writes an iteration's chunks within a millisecond or two), not at the end of the gather window."""
    runner, streams, requests = rig("a", "b", "c", "d")
    runner.gather_quiet_s = 0.02
    start(runner, streams, flowing=["a", "b", "c", "d"])
    streams.script = [{"a": [8], "b": [8]}, {"c": [8]}]
    result, took = timed(runner, Plan(step=1, decode=("a", "b", "c", "d")))
    assert result.outcome.produced == {"a": 1, "b": 1, "c": 1, "d": 0}
    assert took < GATHER_S / 2
    streams.script = [{"d": [8, 9]}]
    result, _ = timed(runner, Plan(step=2, decode=("a", "b", "c", "d")))
    assert requests["d"].output == [7, 8, 9]


def test_a_quiet_spell_after_an_iterations_first_chunks_does_not_end_the_gather():
    """Only one of four streams has sent its token when the engine's server pauses (it often does
    after an iteration's first chunk): the quiet spell passes many times over, and the gather still
    takes the others' tokens when they come."""
    runner, streams, requests = rig("a", "b", "c", "d")
    runner.gather_quiet_s = 0.001
    start(runner, streams, flowing=["a", "b", "c", "d"])
    streams.script = [{"a": [8]}, {}, {}, {}, {}, {}, {"b": [8], "c": [8], "d": [8]}]
    result, took = timed(runner, Plan(step=1, decode=("a", "b", "c", "d")))
    assert result.outcome.produced == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert took < GATHER_S / 2


def test_a_short_pause_within_a_burst_does_not_end_the_gather():
    """Most streams have sent, a pause shorter than the quiet spell, then the last one's token: one
    step takes them all."""
    runner, streams, requests = rig("a", "b", "c", "d")
    runner.gather_quiet_s = GATHER_S / 2
    start(runner, streams, flowing=["a", "b", "c", "d"])
    streams.script = [{"a": [8], "b": [8], "c": [8]}, {}, {"d": [8]}]
    result, took = timed(runner, Plan(step=1, decode=("a", "b", "c", "d")))
    assert result.outcome.produced == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert took < GATHER_S / 2
