"""``python -m prefixroute.core._native``: ``make install`` runs it to say, in one line and once
per install, that the compiled hot path is missing; it prints nothing when the path is in use."""

from prefixroute.core._native import missing

why = missing()
if why is not None:
    print(f"prefixroute: no compiled hot path ({why}); pure Python runs, same results, slower")
