"""The one error type a user can cause; the CLI prints it as one line and exits 2.

It lives in the bottom layer (deployments) so every package above can raise it without
importing upwards.
"""


class SpecPilotError(Exception):
    """A problem the user can fix: the message names what is wrong and how to fix it."""

    exit_code = 2
    is_user_error = True
