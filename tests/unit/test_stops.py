from laneway.core.stops import StopMatcher


def feed_all(matcher: StopMatcher, chunks: list[str]) -> str:
    out = "".join(matcher.feed(c) for c in chunks)
    return out + matcher.flush()


def test_no_stops_passes_text_through_immediately() -> None:
    m = StopMatcher([])
    assert m.feed("abc") == "abc"
    assert not m.stopped


def test_stop_inside_one_chunk_cuts_before_it() -> None:
    m = StopMatcher(["END"])
    assert m.feed("hello END world") == "hello "
    assert m.stopped
    assert m.feed("more") == ""


def test_stop_split_across_chunks_is_never_emitted() -> None:
    m = StopMatcher(["<|stop|>"])
    emitted = [m.feed(c) for c in ["abc<", "|st", "op", "|>tail"]]
    assert "".join(emitted) == "abc"
    assert emitted[0] == "abc"  # only the possible stop prefix is held back
    assert m.stopped


def test_held_back_prefix_is_released_when_it_turns_out_not_to_be_a_stop() -> None:
    m = StopMatcher(["STOP"])
    assert m.feed("ST") == ""
    assert m.feed("AR") == "STAR"
    assert feed_all(StopMatcher(["STOP"]), ["x", "S", "T"]) == "xST"


def test_earliest_of_several_stops_wins() -> None:
    assert StopMatcher(["world", "lo"]).feed("hello world") == "hel"


def test_empty_and_duplicate_stops_are_ignored() -> None:
    m = StopMatcher(["", "x", "x"])
    assert m.stops == ("x",)


def test_include_stop_str_in_output_keeps_the_stop_and_nothing_after_it() -> None:
    assert StopMatcher(["END"], keep_stop=True).feed("hello END world") == "hello END"
    assert feed_all(StopMatcher(["<|stop|>"], keep_stop=True), ["abc<", "|st", "op", "|>tail"]) == "abc<|stop|>"
    assert StopMatcher(["ab", "abc"], keep_stop=True).feed("xabcd") == "xabc"  # at one place, the longest
