"""The folder ``miniray run --ray`` puts first on ``PYTHONPATH``; it holds only
``sitecustomize.py``, which Python runs at start-up. Not imported as a package."""
