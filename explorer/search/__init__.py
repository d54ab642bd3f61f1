"""search: what to measure next.  Acquisition (variance reduction per second, safe), the ask/tell
core of the learning loop, the store every measurement and observation goes to, and the
report of what it holds."""
