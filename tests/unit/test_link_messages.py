"""The daemon link's messages: every one survives its encoding, and a line of another version, or none,
is refused by name rather than misread."""

from __future__ import annotations

import pytest

from fsched.core.ports.link import (
    VERSION,
    Claim,
    End,
    Follow,
    Forget,
    Hello,
    LinkRefused,
    Steps,
    StepText,
    Wake,
    Watch,
    decode,
    encode,
    greeting,
)
from fsched.core.types import RequestStatus

EVERY_MESSAGE = [
    Hello(VERSION), Wake(), Claim(), Watch(7), Forget(7),
    Steps([StepText(7, "41", 3, "any text: NUL \x00, a lone surrogate \udc80, é", 5),
           StepText(8, "43", 0, "", 1, (None, 1.0)), StepText(9, "44", 0, "x", 1, (1.5, 1.25))]),
    End(7, "41", RequestStatus.FINISHED_STOPPED, "the whole text", 9, 12, None, "m", 1.5, 1.25, 2.0),
    End(7, "42", RequestStatus.FINISHED_FAILED, "", 0, None, "the prompt is too long", "m", None, 1.0),
    Follow(7),
]


# The wire of this link version, byte for byte. A change of a message's fields or of the encoding fails
# here: bump VERSION with it (then write these lines anew), so that ends of two versions refuse each
# other instead of misreading.
WIRE = {5: [
    b'["hello",5]', b'["wake"]', b'["claim"]', b'["watch",7]', b'["forget",7]',
    b'["steps",[[7,"41",3,"any text: NUL \\u0000, a lone surrogate \\udc80, \\u00e9",5,null],'
    b'[8,"43",0,"",1,[null,1.0]],[9,"44",0,"x",1,[1.5,1.25]]]]',
    b'["end",7,"41","finished_stopped","the whole text",9,12,null,"m",1.5,1.25,2.0]',
    b'["end",7,"42","finished_failed","",0,null,"the prompt is too long","m",null,1.0,null]',
    b'["follow",7]',
]}


def test_the_wire_is_this_versions():
    assert encode(EVERY_MESSAGE).splitlines() == WIRE[VERSION]


def test_every_message_reads_back_as_it_was_written():
    data = encode(EVERY_MESSAGE)
    assert data.isascii() and data.count(b"\n") == len(EVERY_MESSAGE)  # one line each, any text escaped
    back = [decode(line) for line in data.splitlines()]
    assert back == EVERY_MESSAGE
    assert back[6].status is RequestStatus.FINISHED_STOPPED and isinstance(back[7].status, RequestStatus)


def test_text_and_end_are_a_requests_progress():
    text = StepText(7, "41", 2, "llo", 3, (1.5, 1.25)).progress(before="he??")
    assert (text.id, text.job_id, text.status, text.output_text, text.num_output_tokens) == (
        "41", 7, RequestStatus.RUNNING, "hello", 3)
    assert (text.first_token_at, text.enqueued_at) == (1.5, 1.25)
    end = EVERY_MESSAGE[6].progress()
    got = (end.status, end.output_text, end.prompt_tokens, end.finish_reason, end.finished_at, end.model)
    assert got == (
        RequestStatus.FINISHED_STOPPED, "the whole text", 12, "stop", 2.0, "m")


@pytest.mark.parametrize("line", [
    b'{"op": "watch", "job": 7}',  # a line of the link before it had versions
    b'["watch", "seven"]', b'["watch"]', b'["watch", 7, 8]', b'["shout", 1]', b"[]", b"not json",
    b'["text",7,"41",3,"a step of link version 2",5,1.5,1.25]', b'["steps",[[7,"41",3,"short"]]]',
    b'["steps",[["7","41",3,"job by name",5,1.5,1.25]]]', b'["steps",7]',
    b'["steps",[[7,"41",3,"a step of link version 3",5,1.5,1.25]]]', b'["steps",[[7,"41",0,"x",1,[1.5]]]]',
    b'["end", 7, "41", "exploded", "", 0, null, null, null, null, null, 1.0]',
])
def test_a_line_this_version_cannot_read_is_refused(line):
    with pytest.raises(LinkRefused, match=f"link version {VERSION}"):
        decode(line)


def test_a_link_opens_with_a_hello_of_this_version_or_is_refused_naming_both():
    assert greeting(encode([Hello(VERSION)]), "a server") == Hello(VERSION)
    with pytest.raises(LinkRefused) as other:
        greeting(encode([Hello(VERSION + 1)]), "the daemon at h:1")
    assert str(other.value) == (f"the daemon at h:1 speaks link version {VERSION + 1}, this end {VERSION}; "
                                "the link is refused")
    with pytest.raises(LinkRefused, match="did not open with a hello"):
        greeting(encode([Wake()]), "a server")
    with pytest.raises(LinkRefused, match="speaks no link version"):
        greeting(b'{"op": "wake"}\n', "a server")
