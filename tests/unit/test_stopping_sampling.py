"""Stop rules (pure) and reproducible sampling (torch, no model)."""

from __future__ import annotations

import random

import pytest

from fsched.core.runners.stopping import StopRules, StopText, check_stop, first_stop
from fsched.core.types import RequestStatus

EOS = frozenset({2})


def chars(tokens) -> str:
    """A decoder whose tokens are characters (token = code point)."""
    return "".join(map(chr, tokens))


def stop(token=7, generated=1, max_tokens=10, context=20, limit=100, text=None, stops=()):
    read = None
    if text is not None:
        read = StopText(stops, chars)
        read.extend([ord(c) for c in text])
    return check_stop(token, generated, max_tokens, context, limit, EOS, read, StopRules(stop=stops))


class Bytes:
    """A byte-level decoder (as GPT-2's): each token a few bytes, a character split over tokens decodes
    to U+FFFD until its last byte comes. Counts the tokens it decodes."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces
        self.decoded = 0

    def __call__(self, tokens) -> str:
        self.decoded += len(tokens)
        return b"".join(self.pieces[t] for t in tokens).decode("utf-8", errors="replace")


PIECES = [b"a", b"b", b" ", b"EN", b"D", b"\xc3", b"\xa9", b"\xe2\x82", b"\xac", b"x\n", b"\n"]


def run(tokens: list[int], stops: tuple[str, ...], decode, include: bool = False, min_tokens: int = 0,
        prompt: int = 0):
    """Feed a request's tokens one at a time (after `prompt` tokens of prompt); where it stops, cut."""
    text = StopText(stops, decode, prompt)
    rules = StopRules(stop=stops, include_stop=include, min_tokens=min_tokens)
    context = [0] * prompt
    for n, token in enumerate(tokens, 1):
        context.append(token)
        text.extend(context)
        check = check_stop(token, n, 10**6, len(context), 10**7, frozenset(), text, rules)
        if check.finished is not None:
            return n, check.text_end
    return None, None


def whole(tokens: list[int], stops, decode, include: bool = False, min_tokens: int = 0):
    """The same, decoding the whole output at every token (what the stop check did before)."""
    for n in range(max(1, min_tokens), len(tokens) + 1):
        cut = first_stop(decode(tokens[:n]), stops, include)
        if cut is not None:
            return n, cut
    return None, None


def test_eos_max_tokens_and_context():
    assert stop(token=2).finished is RequestStatus.FINISHED_STOPPED
    assert stop(generated=10).finished is RequestStatus.FINISHED_LENGTH
    assert stop(context=100).finished is RequestStatus.FINISHED_LENGTH
    assert stop().finished is None


def test_stop_string_cuts_the_text_at_the_earliest_match():
    check = stop(text="hello world. bye", stops=("bye", "."))
    assert check.finished is RequestStatus.FINISHED_STOPPED and check.text_end == len("hello world")
    assert stop(text="hello", stops=("xyz",)).finished is None


def test_a_stop_string_split_over_tokens_and_characters_is_found_on_its_last_token():
    decode = Bytes(PIECES)
    # "ab E" "N" ... : "END" arrives as "EN" then "D"; "é" as two tokens, "€" as two
    tokens = [0, 1, 5, 6, 2, 7, 8, 3, 4, 0]
    assert run(tokens, ("END",), decode) == (9, len("abé €"))
    assert run(tokens, ("END",), decode, include=True) == (9, len("abé €END"))
    assert run(tokens, ("é €",), decode) == (7, 2)  # found once the euro sign is whole
    assert run(tokens, ("\ufffd",), decode) == (None, None)  # half a character is never text
    assert run(tokens, ("END",), Bytes(PIECES), prompt=3) == (9, len("abé €"))


def test_stop_strings_found_before_min_tokens_end_it_at_min_tokens():
    tokens = [0, 3, 4, 1, 1, 1, 1]
    assert run(tokens, ("END",), Bytes(PIECES), min_tokens=5) == (5, 1)
    assert run(tokens, ("END",), Bytes(PIECES), min_tokens=2) == (3, 1)


def test_the_window_finds_what_decoding_the_whole_output_finds():
    rng = random.Random(7)
    for _ in range(300):
        tokens = [rng.randrange(len(PIECES)) for _ in range(rng.randrange(1, 40))]
        stops = tuple(rng.choice(["END", "b b", "\n\n", "é", "€a", "x", "ab ENDa"])
                      for _ in range(rng.randrange(1, 3)))
        include, min_tokens = rng.random() < 0.5, rng.randrange(0, 6)
        assert run(tokens, stops, Bytes(PIECES), include, min_tokens) == whole(
            tokens, stops, Bytes(PIECES), include, min_tokens), (tokens, stops, include, min_tokens)


def test_each_token_is_decoded_a_bounded_number_of_times():
    """The cost of a token is its own text and its neighbour's, never the output so far."""
    decode = Bytes(PIECES)
    tokens = [0, 1, 2] * 2000
    assert run(tokens, ("END", "\n\n"), decode) == (None, None)
    assert decode.decoded <= 4 * len(tokens)


def test_position_seed_mixes_seed_and_position():
    from fsched.core.runners.hf.sampling import position_seed

    seeds = {position_seed(s, p) for s in range(20) for p in range(20)}
    assert len(seeds) == 400 and all(0 <= s < 2**63 for s in seeds)
    assert position_seed(5, 3) == position_seed(5, 3)


def test_sampling_depends_only_on_seed_and_position():
    torch = pytest.importorskip("torch")
    from fsched.core.runners.hf.sampling import Row, choose_tokens
    from fsched.core.types import SamplingParams

    def sample(logits, params, position):
        return choose_tokens(logits.unsqueeze(0), [Row(params, position)]).tokens[0]

    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    p = SamplingParams(max_tokens=5, temperature=1.0, seed=42)
    draws = [sample(logits, p, pos) for pos in range(30)]
    assert draws == [sample(logits, p, pos) for pos in range(30)]  # same seed, same positions
    assert len(set(draws)) > 5  # positions draw differently
    other = SamplingParams(max_tokens=5, temperature=1.0, seed=43)
    assert draws != [sample(logits, other, pos) for pos in range(30)]
    # top_k=1 and greedy agree; top_p keeps only the nucleus
    assert sample(logits, SamplingParams(5, temperature=1.0, top_k=1, seed=1), 0) == int(logits.argmax())
    nucleus = {
        sample(logits, SamplingParams(5, temperature=1.0, top_p=0.05, seed=1), pos) for pos in range(50)
    }
    probs = torch.softmax(logits, -1)
    top = set(torch.argsort(probs, descending=True)[:3].tolist())
    assert nucleus <= top
    rows = torch.stack([logits, logits])
    greedy = SamplingParams(5, temperature=0)
    both = choose_tokens(rows, [Row(greedy, 0), Row(p, 7)]).tokens
    assert both == [int(logits.argmax()), sample(logits, p, 7)]


@pytest.mark.parametrize("seed", range(4))
def test_a_backend_decode_read_through_the_library_stream_stops_where_the_whole_output_does(seed: int):
    """A `tokenizers` backend's own decode is read through the library's incremental decoder: the same
    stops and cuts as decoding the whole output at every token (random ids: characters split anyhow)."""
    from tests.unit.test_detokenize import decoder, sequence

    rng = random.Random(seed)
    decode = decoder("stream", True)
    assert StopText(("x",), decode)._stream is not None
    for _ in range(25):
        tokens = sequence(rng, rng.randrange(1, 60))
        text = decode(tokens)
        starts = sorted(rng.sample(range(len(text)), min(2, len(text))))
        picks = [text[i:i + rng.randrange(1, 4)] for i in starts]
        stops = tuple(s for s in picks if s.strip() and "\ufffd" not in s) or ("zzz",)
        include, min_tokens = rng.random() < 0.5, rng.randrange(0, 6)
        assert run(tokens, stops, decode, include, min_tokens) == whole(
            tokens, stops, decode, include, min_tokens), (tokens, stops)


def test_a_stream_that_fails_leaves_the_stop_strings_to_the_window():
    from tests.unit.test_detokenize import decoder, sequence

    def refusing(token: int) -> str | None:
        raise RuntimeError("Invalid prefix encountered")

    decode = decoder("stream", True)
    tokens = sequence(random.Random(11), 80)
    read = StopText(("\x00never",), decode)
    read.extend(tokens[:20])
    read._stream = refusing
    whole_at = 0
    for k in range(21, 81):
        read.extend(tokens[:k])
        expected = decode(tokens[:k])
        assert expected.startswith(read.text)
        if not expected.endswith("\ufffd"):
            assert read.text == expected, k
            whole_at += 1
    assert read._stream is None and whole_at > 20
