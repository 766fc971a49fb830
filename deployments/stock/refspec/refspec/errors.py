"""refspec's one user-facing error: a message that names the problem and the fix."""


class RefspecError(Exception):
    is_user_error = True
