"""The exception a validation rule raises: a broken rule, before the file name is put in
front (``validation.validate`` turns it into the one-line ``InputError``)."""


class Invalid(Exception):
    """A broken rule, before the file name is put in front."""
