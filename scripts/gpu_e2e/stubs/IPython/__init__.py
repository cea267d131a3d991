"""Stand-in ``IPython``: SGLang imports ``IPython.display`` at module level for notebook helpers only."""
