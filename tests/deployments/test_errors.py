"""Messages that compare two hashes show each far enough to see where they differ."""

from __future__ import annotations

from specpilot.deployments import differing


def test_hashes_that_differ_early_show_twelve_characters():
    a, b = "1" * 40, "2" + "1" * 39
    assert differing(a, b) == ("1" * 12, "2" + "1" * 11)


def test_hashes_sharing_a_long_prefix_show_four_characters_past_it():
    a = "0123456789abcdef0123" + "a" * 20
    b = "0123456789abcdef0123" + "b" * 20
    got = differing(a, b)
    assert got == (a[:24], b[:24]) and got[0] != got[1]


def test_equal_hashes_are_shown_whole():
    h = "f" * 40
    assert differing(h, h) == (h, h)
