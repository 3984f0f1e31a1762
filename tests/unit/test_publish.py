"""What the daemon pushes of a step and when: a request whose tokens could come out otherwise after a
crash (a sampled one on a remote engine) is written before any of its text is pushed; one whose write
failed is not pushed (its text goes with a later step's)."""

from __future__ import annotations

from fsched.core.daemon.holdings import Holdings
from fsched.core.daemon.publish import Publisher
from fsched.core.ports.records import StorageError
from fsched.core.sched.request import Request
from fsched.core.types import RequestClass


class Link:
    def __init__(self, log: list) -> None:
        self.log = log

    def watcher(self, job_id: int) -> object | None:
        return "server"

    def send(self, lines: dict) -> None:
        pushed = sorted(t.request for messages in lines.values() for steps in messages for t in steps.texts)
        if pushed:
            self.log.append(("pushed", pushed))


def rig(write) -> tuple[Publisher, Holdings, list]:
    log: list = []
    held = Holdings()
    for i, rid in enumerate(("sampled", "greedy")):
        held.add(Request(rid, "t", RequestClass.STREAMING, 1, 8, 0.0, job_id=i + 1, output=[1, 2],
                         dirty=True))
    publisher = Publisher(Link(log), held, lambda r: " ".join(map(str, r.output)), "m",
                          redraws=lambda r: r.id == "sampled", write_first=lambda rs: write(log, rs))
    return publisher, held, log


def test_a_request_that_redraws_is_written_before_its_text_is_pushed() -> None:
    def write(log: list, requests: list[Request]) -> None:
        log.append(("written", [r.id for r in requests]))

    publisher, _, log = rig(write)
    publisher.step({"sampled": 2, "greedy": 2}, [], 0.0)
    assert log == [("written", ["sampled"]), ("pushed", ["greedy", "sampled"])]


def test_one_whose_write_failed_is_pushed_later_whole() -> None:
    failing = [True]

    def write(log: list, requests: list[Request]) -> None:
        if failing[0]:
            raise StorageError("locked")
        log.append(("written", [r.id for r in requests]))

    publisher, held, log = rig(write)
    publisher.step({"sampled": 2, "greedy": 2}, [], 0.0)
    assert log == [("pushed", ["greedy"])]
    failing[0] = False
    held.get("sampled").output.append(3)
    sent: list = []
    publisher.link.send = lambda lines: sent.extend(t for m in lines.values() for s in m for t in s.texts)
    publisher.step({"sampled": 3}, [], 0.0)
    ((text,),) = [[t for t in sent if t.request == "sampled"]]
    assert (text.start, text.text) == (0, "1 2 3")  # nothing of it was pushed before


def test_a_requests_times_go_with_its_first_texts_on_each_connection_only() -> None:
    publisher, held, _ = rig(lambda log, requests: None)
    held.get("greedy").first_token_at = None
    watching = ["server A"]
    publisher.link.watcher = lambda job_id: watching[0]
    sent: list = []
    publisher.link.send = lambda lines: sent.extend((conn, t) for conn, messages in lines.items()
                                                    for steps in messages for t in steps.texts)

    def times() -> list:
        found = [(conn, t.times) for conn, t in sent if t.request == "greedy"]
        sent.clear()
        return found

    publisher.step({"greedy": 2}, [], 0.0)
    assert times() == [("server A", (None, 0.0))]  # no first token time yet: sent again next step
    held.get("greedy").first_token_at = 5.0
    for _ in range(2):
        publisher.step({"greedy": 2}, [], 0.0)
    assert times() == [("server A", (5.0 + held.wall_offset, 0.0)), ("server A", None)]
    watching[0] = "server B"  # a new connection (the server linked again) is told them again
    publisher.step({"greedy": 2}, [], 0.0)
    assert times() == [("server B", (5.0 + held.wall_offset, 0.0))]


def test_an_end_goes_with_its_step_unless_the_request_redraws_then_once_its_completion_is_written() -> None:
    from fsched.core.daemon.engine import EngineResult
    from fsched.core.ports.link import End
    from fsched.core.types import RequestStatus

    publisher, _, log = rig(lambda log, requests: None)
    sent: list = []
    publisher.link.send = lambda lines: sent.extend(m for messages in lines.values() for m in messages)

    def result(rid: str) -> EngineResult:
        return EngineResult(rid, [1, 2], "1 2", RequestStatus.FINISHED_LENGTH, prompt_tokens=1)

    publisher.step({"sampled": 2, "greedy": 2}, [result("sampled"), result("greedy")], 3.0)
    ends = [m for m in sent if isinstance(m, End)]
    assert [(e.request, e.finished_at) for e in ends] == [("greedy", 3.0)]  # before the step's write
    sent.clear()
    publisher.written(4.0)  # the step's completions are in the table
    assert [(m.request, m.finished_at) for m in sent] == [("sampled", 4.0)]
