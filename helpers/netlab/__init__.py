"""The network lab: N "nodes" on one machine, each a network namespace behind one bridge.

Why: multi-node failure modes (MN1-MN4: a node that never joins, the wrong
NIC, a dead peer, an MTU black hole) need two machines with a network between them.  Network
namespaces give each "node" its own interfaces, addresses, routes, sysctls and ports, so a
two-node ``torchrun`` on one box behaves like one on two boxes (PF-netns-nodes).

Layout (``name="rb"``, 2 nodes)::

    netns rb-sw:     br0 (bridge) -- p0, p1             (veth ends, TSO/GSO off)
    netns rb-node0:  eth0 10.77.0.10/24, lo, hostname node0, /etc/hosts lists node0..nodeN
    netns rb-node1:  eth0 10.77.0.11/24, lo, hostname node1, ...

* The bridge lives in a namespace of its own: the host's network is never touched (every ``ip``
  command here runs with ``-n <lab namespace>``).
* Each node also has its own UTS namespace (hostname ``nodeI``) and mount namespace (its own
  ``/etc/hosts``, optionally a private ``/tmp``).  Both are kept by bind-mounting the namespace
  files under ``/run/runbook-lab/<name>/``, so the lab outlives the Python process that built
  it (``runbook lab up`` returns and the lab stays) and any process can enter a node with
  :meth:`Lab.node_argv`.  Never run ``hostname`` under plain ``ip netns exec``: that renames the
  real host (PF-hostname-loopback).
* The whole state is recoverable from the system: the namespaces named ``<name>-sw`` /
  ``<name>-nodeI`` (``ip netns list``) and the folder ``/run/runbook-lab/<name>/``.
* Root, or rootless where unprivileged user namespaces work (:func:`lab_available`): rootless,
  all of the above lives inside one user + mount + network namespace held by a process whose
  last argument is ``runbook-lab-holder-<name>`` (its ``/run`` is a private tmpfs), and
  :meth:`Lab.node_argv` enters that user namespace first.  Processes in the nodes then run as
  "root" mapped to your own uid.

Fault injection (each one is a real kernel state, not a simulation): :meth:`Lab.set_mtu`,
:meth:`Lab.add_decoy`, :meth:`Lab.rename_data_iface`, :meth:`Lab.cut_link` /
:meth:`Lab.restore_link`, :meth:`Lab.kill_node`, :meth:`Lab.set_sysctl`,
:meth:`Lab.set_host_entry`.

:func:`inject_when` fires one of them when a rank of a running job prints a given line.

Multi-node jobs: :meth:`Lab.torchrun_commands` builds one ``torchrun`` per node (c10d or static
rendezvous, seed D2) and :meth:`Lab.launch` runs them through :func:`helpers.jobs.run_commands`.

Package layout: :mod:`~helpers.netlab._host` (root vs rootless, one mode object),
:mod:`~helpers.netlab.lab` (:class:`Lab`: naming, up/down/attach/status, entering a node),
:mod:`~helpers.netlab.faults` (the fault methods, :func:`inject_when`),
:mod:`~helpers.netlab.multinode` (``torchrun_commands``, ``launch``, :func:`node_output`).
Everything is re-exported here: ``helpers.netlab.Lab``, ``netlab.up(...)``...

Needs iproute2 and util-linux; ethtool when present (a Python ioctl does the same otherwise).
Nothing runs at import.
"""

from __future__ import annotations

import shutil  # noqa: F401  (tests patch netlab.shutil.which)

from helpers.netlab._host import HOLDER_PREFIX, LAB_ROOT, NETNS_DIR, Host, RootlessHost, lab_available, lab_names
from helpers.netlab.faults import DATA_IFACE, DECOY_NET, SIDES, FaultsMixin, FaultWatch, inject_when, inject_when_joined
from helpers.netlab.lab import BRIDGE, DEFAULT_NAME, DEFAULT_SUBNET, FIRST_HOST, MAX_NODES, Lab, down, format_status, status, up
from helpers.netlab.multinode import FORMS, MultiNodeMixin, node_output, rendezvous_flags
from helpers.netlab.slurmlab import HEAD, slurm_available

__all__ = ["BRIDGE", "DATA_IFACE", "DECOY_NET", "DEFAULT_NAME", "DEFAULT_SUBNET", "FIRST_HOST", "FORMS", "HOLDER_PREFIX",
           "LAB_ROOT", "MAX_NODES", "NETNS_DIR", "SIDES", "HEAD", "FaultWatch", "FaultsMixin", "Host", "Lab", "MultiNodeMixin",
           "RootlessHost", "down", "format_status", "inject_when", "inject_when_joined", "lab_available", "lab_names",
           "node_output", "rendezvous_flags", "slurm_available", "status", "up"]
