"""``distgrad offload CONFIG``: one model under several activation-offloading setups.

Each ``[[run]]`` of the config (no offloading, disk, disk above a size threshold,
the activation store, tiered, ...) runs in a fresh process of its own: one
warm-up step, then ``experiment.steps`` measured forward+backward steps, the
processes taking turns step by step (so a machine that gets busier slows every
run alike). Peak memory is the process's peak resident set during a step minus
its resident set just before it (the kernel's high-water mark, reset per step):
everything the process holds counts, nothing is estimated.

Modules: :mod:`.config` (the TOML file: keys, defaults, checks), :mod:`.runner`
(the processes and the activation store they share), :mod:`.report` (the table,
``results.json``, the plots), :mod:`.command` (the ``distgrad offload`` command).
"""
