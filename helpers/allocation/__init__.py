"""The allocation check (``runbook diagnose``, notebook 00): does this allocation work, and which node to drain.

One folder for one concept, the way :mod:`helpers.lint` and :mod:`helpers.netlab` are laid out.  What runs
where, who grades it, and where it lands in ``report.json``:

=====================  ==========================================  ==============================  ==================
module                 what it runs                                 where                           graded by
=====================  ==========================================  ==============================  ==================
:mod:`.local`          env contract, collectives + busbw sweep,     this node (ranks as processes   :mod:`.grades`
                       the Gilbreth smoke tests, the CUDA            through :mod:`helpers.jobs`)
                       toolchain, the host checks, the network
                       pre-flight (through :mod:`helpers.preflight`)
:mod:`.across`         one SLURM step per node (``node-report``),   every node of the allocation    :mod:`.grades`
                       ONE job over every node (contract,           (``srun`` through
                       correctness, busbw, node pairs), the         :class:`helpers.slurm.SlurmClient`)
                       multi-node smoke test, the drain list
:mod:`.grades`         nothing: pure functions and every threshold  -                               -
:mod:`.params`         nothing: the notebook parameters, checked    -                               -
                       before any job starts
=====================  ==========================================  ==============================  ==================

Every record is a :class:`helpers.checks.Check`; :mod:`helpers.report` writes ``report.json`` /
``report.md`` (ids: ``env.*``, ``launcher.*``, ``collectives.*``, ``smoke.*``, ``toolchain.*``, ``host.*``,
``net.*`` on one node; ``node.*``, ``job.*``, ``pairs.*``, ``envelope.*`` across nodes).  Measuring the host
(:mod:`helpers.hostinfo`), the network pre-flight (:mod:`helpers.preflight`), the report and busbw
(:mod:`helpers.busbw`) have homes of their own: other tools use them too.

Import the module you need (``from helpers.allocation import across, grades``); this file imports nothing.
"""
