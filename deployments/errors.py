"""The one error type a user can cause; the CLI prints it as one line and exits 2.

It lives in the bottom layer (deployments) so every package above can raise it without
importing upwards.
"""


class SpecPilotError(Exception):
    """A problem the user can fix: the message names what is wrong and how to fix it."""

    exit_code = 2
    is_user_error = True


def differing(a: str, b: str, least: int = 12) -> tuple[str, str]:
    """Prefixes of two hashes long enough to show where they differ (at least `least` characters,
    4 past their common prefix), for messages that compare them."""
    common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    n = max(least, common + 4)
    return a[:n], b[:n]
