"""The one exception type for mistakes a user can fix (bad data, bad config, bad paths).

The CLI prints these as one clear line and exits 2; anything else is a bug and keeps its traceback."""


class PersonalensError(Exception):
    pass
