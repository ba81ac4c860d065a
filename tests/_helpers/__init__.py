"""Helpers shared by the test suite: tolerances, random arenas and the plain hybrid model.

`tests/conftest.py` puts the `tests` folder on `sys.path`, so `from _helpers.tolerances import
tol` works from any working directory and any test folder.
"""
