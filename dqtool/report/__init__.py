"""HTML reports a person can look at: ``check --report`` and ``inspect --report``.

One self-contained file each: the charts are inline SVG drawn here (no plotting library,
no script, nothing fetched: the page's Content-Security-Policy forbids any request), so a
report opens offline and ``import dqtool`` never pays for it. Imported only when a report
is asked for.
"""
