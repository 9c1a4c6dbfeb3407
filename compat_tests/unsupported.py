"""The documents' examples that miniray does not run yet, in one place.

Owns the list only. conftest.py reads it (by path) and marks every test of a listed example
as skipped with its reason; test_doc_examples.py checks that every key names an example of
the manifest. Remove an entry when the issue that brings it lands; to see which listed
examples already pass, run with ``MINIRAY_COMPAT_RUN_UNSUPPORTED=1``.

Keys are example file names; values say what is missing and the issue that brings it. An
example that needs two features names both.
"""

from __future__ import annotations

UNSUPPORTED: dict = {}
