"""Where the rules come from: one registry of the ids that checks, docstrings and notebooks cite.

A :class:`helpers.checks.Check`'s ``source`` (and every docstring that states a rule or a
threshold) names an id from :data:`SOURCES` instead of a file outside this repository:

* ``D1`` … ``D23``: launching and debugging PyTorch jobs (torchrun, Accelerate, DeepSpeed, DDP,
  FSDP, hangs), each with the public page the rule was taken from;
* ``MN1`` … ``MN6`` and ``MN-checklist``: multi-node NCCL and elastic-training failures;
* ``Gilbreth 4.2``, ``Gilbreth 8.12``, …: sections of the Gilbreth (Purdue) HPC training guide, a
  cluster guide with no public copy; each fact says what the section established on that cluster,
  and the URL is the vendor documentation of the setting it is about, where there is one;
* ``PF-…``: platform facts measured on the 2-core CI machines this course is built and tested on
  (Debian 12, Python 3.11, no GPU; torch 2.13.0+cpu with gloo, deepspeed 0.19.8, accelerate 1.15.0,
  slurm-wlm 22.05.8, iproute2 6.1.0), with the public documentation or issue behind them.

``docs/sources.md`` is :func:`render_markdown`'s output (a test keeps them equal).  Regenerate it with::

    python -c "from helpers import sources; print(sources.render_markdown(), end='')" > docs/sources.md

Standard library only; nothing runs at import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REGENERATE = "python -c \"from helpers import sources; print(sources.render_markdown(), end='')\" > docs/sources.md"

TORCHRUN_DOCS = "https://docs.pytorch.org/docs/stable/elastic/run.html"
DIST_DEBUG_DOCS = "https://docs.pytorch.org/docs/stable/distributed.html#debugging-torch-distributed-applications"
NCCL_ENV_DOCS = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
NCCL_IFNAME_DOCS = NCCL_ENV_DOCS + "#nccl-socket-ifname"
NCCL_TROUBLESHOOTING = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"
NCCL_ACS_DOCS = ("https://github.com/NVIDIA/nccl/blob/v2.30.7-1/docs/userguide/source/troubleshooting/"
                 "gpu_troubleshooting.rst#pci-access-control-services-acs")
NCCL_PATHS_SRC = "https://github.com/NVIDIA/nccl/blob/v2.30.7-1/src/graph/paths.cc"
DS_CONFIG_DOCS = "https://www.deepspeed.ai/docs/config-json/"
SRUN_DOCS = "https://slurm.schedmd.com/srun.html"
SBATCH_DOCS = "https://slurm.schedmd.com/sbatch.html"
ACCELERATE_LAUNCH_DOCS = "https://huggingface.co/docs/accelerate/en/basic_tutorials/launch"


@dataclass(frozen=True)
class Source:
    """One citable fact.

    Attributes:
        id: what code and notebooks cite (``D21``, ``MN4``, ``Gilbreth 8.12``, ``PF-mtu-blackhole``).
        fact: one sentence: the rule or the measurement the id stands for.
        urls: public pages a user can open to check it (may be empty for a Gilbreth section
            about that cluster only).
    """

    id: str
    fact: str
    urls: tuple[str, ...] = ()


def _entries() -> tuple[Source, ...]:
    """Every registered source, in the order :func:`render_markdown` lists them."""
    s = Source
    return (
        # ---- distributed launch (D1-D23)
        s("D1", "torch.distributed learns rank, world size and the master's address from environment variables "
                "(RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT); a launcher such as "
                "torchrun sets them for each process, a bare `python` sets none, so the group never forms.",
          (TORCHRUN_DOCS,)),
        s("D2", "`--standalone` hosts a private rendezvous on localhost for one node; every node of a multi-node job must "
                "run the same torchrun command pointing at one shared rendezvous endpoint and id (c10d backend), or the "
                "nodes hang or form separate groups.", (TORCHRUN_DOCS,)),
        s("D3", "Select the GPU with LOCAL_RANK, not RANK: on a second node RANK exceeds the local GPU count, so "
                "`set_device(RANK)` piles every process onto the wrong device; RANK picks the data shard.",
          (TORCHRUN_DOCS,)),
        s("D4", "Two jobs on one node both default to MASTER_PORT 29500, and the second cannot bind the c10d store's "
                "port (`Address already in use`): give each job its own port (or `--rdzv-endpoint=localhost:0`) and "
                "its own GPUs.", ("https://github.com/pytorch/pytorch/issues/85604",)),
        s("D5", "`accelerate launch` takes its process count and mode from a config file or its own flags, not from "
                "torchrun's; without a config it may start a single process.", (ACCELERATE_LAUNCH_DOCS,)),
        s("D6", "The `deepspeed` launcher finds other nodes through a hostfile (`host slots=N`), a mechanism separate "
                "from torchrun's rendezvous; use one launcher per job, not both.",
          ("https://huggingface.co/docs/accelerate/en/usage_guides/deepspeed",)),
        s("D7", "Choosing a strategy: DDP (torchrun) when the model fits on one GPU; FSDP or DeepSpeed ZeRO when it does "
                "not; Accelerate as the launcher in the Hugging Face stack; DeepSpeed when parameters and optimizer "
                "states need separate CPU/NVMe offload.",
          ("https://github.com/huggingface/accelerate/blob/main/docs/source/concept_guides/fsdp_and_deepspeed.md",)),
        s("D8", "DDP waits for a gradient of every parameter each step; a parameter that gets none stops the reduction "
                "(`Expected to have finished reduction in the prior iteration`); `find_unused_parameters=True` tolerates "
                "it at the cost of a graph traversal per step, so fix the unused branch first.",
          ("https://discuss.pytorch.org/t/process-got-stuck-when-set-find-unused-parameters-true-in-ddp/106078",
           "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html")),
        s("D9", "When ranks see different numbers of batches, the rank that finishes first stops calling all_reduce and "
                "the others hang at the last step; DistributedSampler equalises the counts, the Join context manager "
                "covers inputs that are truly uneven.",
          ("https://docs.pytorch.org/tutorials/advanced/generic_join.html",
           "https://discuss.pytorch.org/t/understanding-distributedsampler-and-dataloader-drop-last/206271")),
        s("D10", "DDP averages gradients but not buffers, so each rank's BatchNorm statistics come from its own shard; "
                 "SyncBatchNorm (`convert_sync_batchnorm`) makes them global at the cost of a collective per layer.",
          ("https://docs.pytorch.org/docs/stable/generated/torch.nn.SyncBatchNorm.html",)),
        s("D11", "DDP keeps the per-GPU batch, so the effective batch is per-GPU batch × world size and the learning rate "
                 "tuned for one GPU no longer matches; scale it (linear rule plus warmup) and record the world size.",
          ("https://docs.pytorch.org/docs/stable/notes/ddp.html",)),
        s("D12", "Without an auto-wrap policy FSDP makes the whole model one unit and gathers every parameter at once, "
                 "saving no memory; wrap per transformer block (FSDP2's `fully_shard` per block).",
          ("https://docs.pytorch.org/tutorials/intermediate/FSDP_tutorial.html",
           "https://huggingface.co/docs/accelerate/en/usage_guides/fsdp")),
        s("D13", "FSDP's sharding strategy trades memory for communication: FULL_SHARD shards parameters, gradients and "
                 "optimizer states (like ZeRO-3), SHARD_GRAD_OP keeps parameters whole (like ZeRO-2), HYBRID_SHARD "
                 "shards inside a node and replicates across nodes.",
          ("https://docs.pytorch.org/docs/stable/fsdp.html",)),
        s("D14", "FSDP mixed precision is set per tensor class with `MixedPrecision(param_dtype, reduce_dtype, "
                 "buffer_dtype)`; set all three on purpose (bf16 parameters, fp32 reductions is a safe start).",
          ("https://github.com/pytorch/pytorch/issues/146114",)),
        s("D15", "FSDP's full state dict gathers the whole model on rank 0's CPU (use `rank0_only` and `offload_to_cpu`); "
                 "a sharded state dict through Distributed Checkpoint saves one shard per rank and reloads on any world "
                 "size.", ("https://huggingface.co/docs/accelerate/en/usage_guides/fsdp",)),
        s("D16", "ZeRO stage 1 shards optimizer states across data-parallel ranks, stage 2 adds gradients, stage 3 adds "
                 "parameters; pick the smallest stage that fits, and offload only when stage 3 alone does not.",
          ("https://www.deepspeed.ai/tutorials/zero/",)),
        s("D17", "With a DeepSpeed JSON present, its values (accumulation steps, clipping, ZeRO stage, offload, "
                 "precision) override the Accelerate config's; the JSON keys that matter are zero_optimization, bf16 "
                 "and the batch sizes.", ("https://huggingface.co/docs/accelerate/en/usage_guides/deepspeed",)),
        s("D18", "Under DeepSpeed call `engine.backward(loss)` and `engine.step()`, not `loss.backward()` and "
                 "`optimizer.step()`, and set gradient accumulation in one place (\"auto\" in the JSON) so it is not "
                 "applied twice.", ("https://github.com/microsoft/DeepSpeed/blob/master/deepspeed/runtime/engine.py",)),
        s("D19", "To name a desync: TORCH_DISTRIBUTED_DEBUG=DETAIL (with TORCH_CPP_LOG_LEVEL=INFO) reports ranks that "
                 "call different collectives, NCCL_DEBUG=INFO shows the node whose log stops first, a shorter "
                 "process-group timeout makes the wait end sooner (TORCH_NCCL_ASYNC_ERROR_HANDLING only decides what "
                 "the watchdog does once the timeout or an error fires, and it is on by default), and the Flight "
                 "Recorder keeps the last collectives per rank.",
          ("https://discuss.pytorch.org/t/torch-distributed-collectives-call-logging/172726", DIST_DEBUG_DOCS)),
        s("D20", "A rank that crashes or returns early stops calling collectives and the others wait in theirs; the "
                 "crash is the cause and the hang the symptom, so fix the diverged rank (bad sample, OOM, NaN).",
          (DIST_DEBUG_DOCS,)),
        s("D21", "A collective (barrier, all_reduce, or one hidden in a save or a metric) inside `if rank == 0:` deadlocks "
                 "every rank; run collectives on all ranks and gate only the side effect.",
          ("https://github.com/Lightning-AI/pytorch-lightning/issues/19604",)),
        s("D22", "Loaders of different lengths on different ranks hang the last step (D9's mechanism), and forgetting "
                 "`sampler.set_epoch(epoch)` repeats one shuffle every epoch.",
          ("https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler",)),
        s("D23", "Every rank runs everything by default: prints and progress bars interleave, eval runs N times and N "
                 "writers race on one checkpoint; gate side effects on rank 0 but keep collectives outside the gate, "
                 "then barrier on all ranks before reading the file.",
          ("https://docs.pytorch.org/docs/stable/distributed.html",)),
        # ---- multi-node (MN1-MN6)
        s("MN1", "On NVSwitch nodes a stopped or mismatched nvidia-fabricmanager on one node keeps its ranks out of "
                 "NCCL init, so every node hangs silently; check the service on each node and read which node's "
                 "NCCL_DEBUG=INFO log stops first.",
          ("https://support.crusoecloud.com/hc/en-us/articles/"
           "46061806112155-NCCL-Hangs-and-Multi-Node-Training-Stalls-Caused-by-Failed-nvidia-fabricmanager",)),
        s("MN2", "Left alone, NCCL can bind docker0, the loopback or a slow management NIC; pin the data interface with "
                 "NCCL_SOCKET_IFNAME on every rank (NCCL_IB_HCA for InfiniBand, NCCL_IB_DISABLE=1 without RDMA) and "
                 "confirm the NET line of NCCL_DEBUG=INFO.",
          ("https://github.com/NVIDIA/nccl/issues/1580", NCCL_IFNAME_DOCS)),
        s("MN3", "A dead or slow rank on another node surfaces only when the collective timeout fires: torch 2.13's "
                 "default is 600 s for NCCL process groups and 1800 s for gloo and the others "
                 "(torch.distributed.constants); set the process-group timeout on purpose and keep async error "
                 "handling on.",
          ("https://repost.aws/questions/QURXddiuikQLesRDGz39RhIw/"
           "nccl-socket-timeout-when-using-large-dataset-in-multi-node-pretraining",)),
        s("MN4", "An MTU mismatch on the path (jumbo 9000 at the ends, 1500 in between) lets small messages through and "
                 "silently drops large frames, so big collectives stall; `ping -M do -s 8972` fails where `-s 1472` "
                 "passes; make the MTU equal end to end.", ("https://github.com/moby/moby/issues/4378",)),
        s("MN5", "torchrun's `--max-restarts` rebuilds the worker group but restores no training state; the script must "
                 "load its latest checkpoint at start or every restart begins at step 0.",
          ("https://docs.pytorch.org/tutorials/beginner/ddp_series_fault_tolerance.html",)),
        s("MN6", "Elastic Horovod pauses, without failing, when workers drop below `--min-np`, and errors only after "
                 "HOROVOD_ELASTIC_TIMEOUT (600 s by default).", ("https://horovod.readthedocs.io/en/stable/elastic_include.html",)),
        s("MN-checklist", "Before trusting a multi-node run: fabric manager up on every node, the same NCCL interface "
                          "variables and timeout on every rank, a jumbo-frame ping between nodes, a first launch with "
                          "NCCL_DEBUG=INFO, and a resume that loads the latest checkpoint.",
          ("https://github.com/NVIDIA/nccl/issues/1580", "https://github.com/moby/moby/issues/4378")),
        # ---- Gilbreth HPC guide (no public copy; URLs document the settings)
        s("Gilbreth 1.3", "Gilbreth's nodes name their InfiniBand interfaces differently (ibp161s0 on some, ibp65s0 on "
                          "others; eno1 everywhere), so no interface name may be hard-coded.", (NCCL_IFNAME_DOCS,)),
        s("Gilbreth 4", "Gilbreth's NCCL settings differ by job shape: single-node jobs turn InfiniBand off and restrict P2P "
                        "to NVLink, multi-node jobs keep InfiniBand on and let NCCL pick the interface.",
          (NCCL_ENV_DOCS,)),
        s("Gilbreth 4.1", "On one Gilbreth node collectives timed out after a successful init until NCCL_IB_DISABLE=1, "
                          "NCCL_P2P_LEVEL=NVL, NCCL_SHM_DISABLE=0 and GLOO_SOCKET_IFNAME=lo made them pass over SHM; "
                          "the guide's NCCL_NET_DISABLE=1 is not an NCCL variable (NCCL reads only "
                          "NCCL_NET_DISABLE_INTRA) and did nothing.", (NCCL_ENV_DOCS, NCCL_PATHS_SRC)),
        s("Gilbreth 4.2", "Multi-node jobs on Gilbreth must leave NCCL_SOCKET_IFNAME unset (interface names vary per node) "
                          "and keep NCCL_IB_DISABLE=0; the working transports were NET/IB between nodes and P2P/CUMEM "
                          "inside one.", (NCCL_IFNAME_DOCS,)),
        s("Gilbreth 4.3", "Gilbreth forbids SSH between compute nodes, so pdsh-based launchers (`deepspeed --hostfile`) "
                          "fail; the one working multi-node launch is `srun --ntasks-per-node=1 --export=ALL` running "
                          "torchrun on each node with MASTER_ADDR exported and the node rank from SLURM_NODEID.",
          (SRUN_DOCS, TORCHRUN_DOCS)),
        s("Gilbreth 5", "Smoke test 01: one GPU trains a small MLP forward and backward, then saves and reloads a "
                        "checkpoint.", ()),
        s("Gilbreth 5.3", "The smoke-test model is a three-Linear MLP with GELU (hidden 1024 → 4096 → 4096 → 1024, "
                          "25,175,040 parameters) trained with AdamW and MSE loss.", ()),
        s("Gilbreth 6", "Smoke test 02: DDP on two GPUs of one node with the single-node NCCL settings, then a "
                        "checkpoint save and reload.", ("https://docs.pytorch.org/docs/stable/notes/ddp.html",)),
        s("Gilbreth 6.3", "On one Gilbreth node (two A100 80GB PCIe) NCCL reached `Init COMPLETE` and then hung collectives "
                          "until the 10-minute timeout; the guide blames the IB transport, but its own failing log shows "
                          "the channels `via P2P/CUMEM` (`Using network IB` only names the loaded network plugin), and "
                          "the setting of its fix that changes the transport, NCCL_P2P_LEVEL=NVL, moves them to "
                          "`SHM/direct/direct`: the PCIe P2P hang that NCCL documents for ACS/IOMMU.",
          (NCCL_ACS_DOCS, NCCL_ENV_DOCS)),
        s("Gilbreth 6.4", "The DDP smoke test's model is the same MLP at hidden 2048 (100,681,728 parameters), batch 64 per "
                          "GPU.", ()),
        s("Gilbreth 6.7", "The verified two-GPU DDP run (job 10213612) trained 100 steps at 23.7 steps/s with channels "
                          "`via SHM/direct/direct` and `Init COMPLETE` on both ranks.", ()),
        s("Gilbreth 7", "Smoke test 03: DeepSpeed ZeRO-1 in bf16 on two GPUs of one node, with a collective checkpoint "
                        "save and reload.", ("https://www.deepspeed.ai/tutorials/zero/",)),
        s("Gilbreth 7.1", "ZeRO stage 1 partitions the optimizer states across the data-parallel GPUs while each keeps a "
                          "full model replica.", ("https://www.deepspeed.ai/tutorials/zero/",)),
        s("Gilbreth 7.4", "The ZeRO-1 JSON needs an `optimizer` section (else `zero stage 1 requires an optimizer`), and "
                          "train_batch_size must equal micro batch × GPUs × accumulation steps; bf16 enabled on A100.",
          (DS_CONFIG_DOCS,)),
        s("Gilbreth 7.5", "Three DeepSpeed failures and fixes: a config without an optimizer, float32 inputs to a bf16 "
                          "model (`mat1 and mat2 must have the same dtype`), and save/load_checkpoint called on rank 0 "
                          "only although they are collectives.",
          (DS_CONFIG_DOCS, "https://deepspeed.readthedocs.io/en/latest/model-checkpointing.html")),
        s("Gilbreth 7.7", "The DeepSpeed training script: `deepspeed.initialize` builds the engine from the JSON, the "
                          "loop calls `engine.backward` and `engine.step`, and every rank calls the checkpoint methods.",
          ("https://www.deepspeed.ai/getting-started/",)),
        s("Gilbreth 8.2", "The multi-node job asks for `--ntasks-per-node=1`: srun starts one task per node and torchrun "
                          "spawns that node's GPU ranks.", (SBATCH_DOCS,)),
        s("Gilbreth 8.3", "Multi-node NCCL on Gilbreth: InfiniBand on (NCCL_IB_DISABLE=0), NCCL_SOCKET_IFNAME and "
                          "GLOO_SOCKET_IFNAME unset, since a hard-coded IB name fails on nodes that name it differently "
                          "(`Bootstrap : no socket interface found`).", (NCCL_IFNAME_DOCS,)),
        s("Gilbreth 3.4", "Watch a job with `squeue -u $USER -o \"%i %t %M %r\"`: job id, state code, time used and the "
                          "pending reason; states PD (pending: Resources, Priority), R, CD, F.",
          ("https://slurm.schedmd.com/squeue.html",)),
        s("Gilbreth 8.5", "The multi-node launch that works without ssh: MASTER_ADDR from `scontrol show hostnames` and "
                          "exported, then `srun --ntasks-per-node=1 --export=ALL` running one torchrun per node with "
                          "its node rank taken from SLURM_NODEID inside the task.", (SRUN_DOCS, TORCHRUN_DOCS)),
        s("Gilbreth 8.4", "Single-node vs multi-node settings side by side: IB off vs on, socket interface `lo` or "
                          "unset vs unset, SHM/direct vs NET/IB between nodes plus P2P/CUMEM inside a node.",
          (NCCL_ENV_DOCS,)),
        s("Gilbreth 8.9", "The verified 4-node × 2-GPU DeepSpeed run (job 10213927) used NET/IB/0 between nodes and "
                          "P2P/CUMEM inside each node.", ()),
        s("Gilbreth 8.12", "Five multi-node failure modes seen on Gilbreth: scripts in node-local /tmp, a hard-coded "
                           "NCCL_SOCKET_IFNAME (`Bootstrap : no socket interface found`), SSH-based launchers, variables "
                           "that do not reach the tasks through srun (re-export them inside), and checkpoints saved on "
                           "rank 0 only.", (NCCL_IFNAME_DOCS, SRUN_DOCS)),
        s("Gilbreth 8.13", "The multi-node job template: `--ntasks-per-node=1`, `cd $SLURM_SUBMIT_DIR`, socket "
                           "interface variables unset, MASTER_ADDR from `scontrol show hostnames` exported, and "
                           "`srun --export=ALL` running torchrun on each node.", (SBATCH_DOCS, SRUN_DOCS)),
        s("Gilbreth 9.2", "Troubleshooting list: the single-node NCCL settings for a single-node timeout, IFNAME unset and "
                          "IB on for a multi-node one, shared filesystem instead of /tmp, srun instead of pdsh.",
          (NCCL_TROUBLESHOOTING,)),
        s("Gilbreth 9.3", "Debugging steps: barriers with flushed prints to bisect a hang, NCCL_DEBUG=INFO, "
                          "TORCH_DISTRIBUTED_DEBUG=DETAIL, `Init COMPLETE` per rank, then the transport in use.",
          (DIST_DEBUG_DOCS,)),
        s("Gilbreth 9.4", "Reading NCCL logs: `via P2P/CUMEM` and `via SHM/direct/direct` are healthy inside a node, "
                          "`via NET/...` on a single-node job is suspect, `Init COMPLETE` means init succeeded.",
          (NCCL_ENV_DOCS,)),
        # ---- platform facts measured on the CI machines
        s("PF-port-collision", "Measured (torch 2.13.0+cpu, gloo, 2-core CI machine): a second job on a busy "
                               "`--master-port` fails with DistNetworkError EADDRINUSE, while one sharing a c10d "
                               "`--rdzv-endpoint` silently joins the other job's store and fails with "
                               "RendezvousConnectionError when that job ends.",
          ("https://github.com/pytorch/pytorch/issues/85604", TORCHRUN_DOCS)),
        s("PF-rank-exit", "Measured (torch 2.13.0+cpu, gloo): when one rank raises or exits, the others see `Connection "
                          "closed by peer` within about 1 s; a rank that is alive but elsewhere makes them wait the whole "
                          "timeout (gloo's default is 1800 s).", (DIST_DEBUG_DOCS,)),
        s("PF-gloo-op-mismatch", "Measured (torch 2.13.0+cpu, gloo): a shape or dtype mismatch between ranks aborts at "
                                 "once (`Received data size doesn't match expected size`), while different ops at the "
                                 "same step (broadcast vs all_reduce) hang until the timeout.", (DIST_DEBUG_DOCS,)),
        s("PF-detail-ddp-segfault", "Measured (torch 2.13.0+cpu, gloo): TORCH_DISTRIBUTED_DEBUG=DETAIL names mismatched "
                                    "plain collectives, but together with DDP it segfaults in "
                                    "`c10d::Logger::set_env_variables`; INFO works with DDP.", (DIST_DEBUG_DOCS,)),
        s("PF-find-unused-cost", "Measured (torch 2.13.0+cpu, gloo, 2 ranks on 2 cores): `find_unused_parameters=True` "
                                 "added 15-25 % to the step time of a small model; `static_graph=True` also avoids the "
                                 "reduction error.",
          ("https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html",)),
        s("PF-accelerate-cpu", "Measured (accelerate 1.15.0, torch 2.13.0+cpu): `--cpu --num_processes 2` starts one "
                               "process, `--multi_gpu` on CPU starts two that never synchronise, a real 2-process gloo "
                               "DDP needs ACCELERATE_USE_CPU=1 (or `Accelerator(cpu=True)`), FSDP through Accelerate does "
                               "not run on CPU, and `accelerate test` reports success after running one process.",
          (ACCELERATE_LAUNCH_DOCS,)),
        s("PF-jit-lock", "Measured (torch 2.13.0+cpu, DeepSpeed 0.19.8): a JIT build of a DeepSpeed op killed while it "
                         "held torch's build lock (the file `lock` in the op's folder under TORCH_EXTENSIONS_DIR, "
                         "default ~/.cache/torch_extensions) leaves the file behind, and every later job waits in "
                         "`FileBaton.wait` forever, with no message after DeepSpeed's accelerator line.",
          ("https://github.com/pytorch/pytorch/issues/189245", "https://github.com/OpenRLHF/OpenRLHF/issues/208",
           "https://github.com/huggingface/transformers/issues/26015")),
        s("PF-fr-gloo", "Measured (torch 2.13.0+cpu, gloo): the Flight Recorder (TORCH_FR_BUFFER_SIZE) records gloo "
                        "collectives with their sequence ids but writes no dump at a gloo timeout, and torch's bundled "
                        "analyzer (`python -m torch.distributed.flight_recorder.fr_trace`) crashed on the dumps with "
                        "`KeyError: ('0', 0)`.",
          ("https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html",
           "https://github.com/pytorch/pytorch/issues/140879")),
        s("PF-debug-server", "Measured (torch 2.13.0+cpu, gloo): `torch.distributed.debug.start_debug_server()` starts "
                             "an HTTP worker on every rank and stores its address in the job's TCPStore "
                             "(`debug_server/rank<R>`); the worker's `dump_traceback` handler answers with every "
                             "thread's Python stack, no ptrace needed.  Rank 0 then imports its web page's handlers, "
                             "which need `tabulate` (not a torch dependency): without it rank 0 raises "
                             "ModuleNotFoundError, and the workers already started keep serving.",
          ("https://github.com/pytorch/pytorch/blob/main/torch/distributed/debug/__init__.py",
           "https://docs.python.org/3/library/faulthandler.html")),
        s("PF-elastic-scaleup", "Measured (torch 2.13.0+cpu): an elastic `--nnodes=1:2` scale-up deadlocked in 2 of 2 "
                                "runs (both agents: `DistStoreError: wait timeout ... MASTER_ADDR`); "
                                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 avoided it; a `--max-restarts` crash restart "
                                "begins again at step 0 unless the script loads a checkpoint.",
          ("https://github.com/pytorch/pytorch/issues/135712", "https://github.com/pytorch/pytorch/pull/128096")),
        s("PF-netns-nodes", "Measured (iproute2 6.1.0, root, Debian 12 kernel): network namespaces joined by one bridge "
                            "in a namespace of its own make a 4-node lab in about 0.1 s without touching the host "
                            "network, and a two-node torchrun across them behaves like one across two machines.",
          ("https://man7.org/linux/man-pages/man8/ip-netns.8.html",)),
        s("PF-hostname-loopback", "Measured (torch 2.13.0+cpu, gloo, network lab): a node whose hostname resolves to "
                                  "127.0.0.1 breaks c10d and gloo (a 147 s RendezvousConnectionError, silent hangs, "
                                  "`Connection refused` to 127.0.0.1); each node needs its own hostname and /etc/hosts, "
                                  "and `hostname` under a plain `ip netns exec` renames the real host.",
          (TORCHRUN_DOCS, "https://man7.org/linux/man-pages/man8/ip-netns.8.html")),
        s("PF-mtu-blackhole", "Measured (torch 2.13.0+cpu, gloo, network lab, iproute2 6.1.0): with both node ends at "
                              "MTU 9000 behind a 1500-byte bridge side, `ping -M do -s 8972` is lost, `-s 1472` passes, a "
                              "small all_reduce works and a 64 MiB one times out; one 9000 end alone is hidden by TCP's "
                              "MSS negotiation; TSO/GSO must be off on the veths for a steady repro; "
                              "net.ipv4.tcp_mtu_probing=1 recovers after a ~4 s stall.",
          ("https://github.com/moby/moby/issues/4378", "https://docs.kernel.org/networking/ip-sysctl.html")),
        s("PF-wrong-nic", "Measured (torch 2.13.0+cpu, gloo, network lab): with a decoy `docker0` bridge on every node "
                          "and GLOO_SOCKET_IFNAME=docker0 one side gets `Connection refused` and the other waits 5× the "
                          "init timeout; a name present on one node only fails there at once (`Unable to find address "
                          "for`); gloo does not accept NCCL's `^` exclusion; the kernel has no dummy or netem driver, so "
                          "an empty bridge serves as the decoy.",
          ("https://docs.pytorch.org/docs/stable/distributed.html#choosing-the-network-interface-to-use", NCCL_IFNAME_DOCS)),
        s("PF-node-never-joins", "Measured (torch 2.13.0+cpu, network lab): with the c10d default a node that never joins "
                                 "gives ~603 s of silence and then an empty RendezvousTimeoutError "
                                 "(`--rdzv-conf=join_timeout=20` → 21.7 s); the static form's rank 0 alone hangs silently "
                                 "unless a timeout is set.", ("https://docs.pytorch.org/docs/stable/elastic/rendezvous.html",)),
        s("PF-netns-rootless", "Measured (Debian 12 kernel, iproute2 6.1.0, util-linux unshare): the lab also runs without root where unprivileged user "
                               "namespaces are allowed (`unshare --user --map-root-user --net --mount`, a tmpfs on /run), "
                               "which HPC login nodes often disable.",
          ("https://man7.org/linux/man-pages/man7/user_namespaces.7.html",)),
        s("PF-slurm-unexported-master", "Measured (slurm-wlm 22.05.8 in namespaces, torch 2.13.0+cpu): a job script that "
                                        "assigns MASTER_ADDR without exporting it fails in the tasks with `The hostname "
                                        "of the rendezvous endpoint ':29500' must be ...`.", (SBATCH_DOCS, SRUN_DOCS)),
        s("PF-slurm-node-tmp", "Measured (slurm-wlm 22.05.8 in namespaces): a private /tmp per node reproduces the "
                               "node-local /tmp failure (`Could not open stdout file /tmp/...`, `can't open file "
                               "'/tmp/...py'`), and `srun -w NODE --overlap` runs a command on a node even while a job "
                               "step holds every CPU.", (SRUN_DOCS,)),
        s("PF-slurm-namespaces", "Measured (slurm-wlm 22.05.8, munge 0.5.15, iproute2 6.1.0, torch 2.13.0+cpu): slurmctld "
                                 "plus one slurmd per network-namespace node (entered with nsenter and `unshare --uts "
                                 "--mount`, since plain `ip netns exec` remounts /sys and slurmd dies) start in ~0.2 s, and "
                                 "a 2-node × 2-rank sbatch of srun + torchrun reaches COMPLETED in 8-17 s on an idle machine.",
          ("https://slurm.schedmd.com/quickstart_admin.html", "https://man7.org/linux/man-pages/man1/nsenter.1.html")),
    )


SOURCES: dict[str, Source] = {src.id: src for src in _entries()}
"""Every citable id -> its :class:`Source`."""

GROUPS = (("D", "Launching and debugging distributed PyTorch jobs (D1-D23)"),
          ("MN", "Multi-node NCCL and elastic training (MN1-MN6)"),
          ("Gilbreth", "Gilbreth HPC training guide (sections; no public copy, links document the settings)"),
          ("PF", "Platform facts measured on the 2-core CI machines"))


def _group(source_id: str) -> str:
    """The :data:`GROUPS` key of ``source_id`` (``D``, ``MN``, ``Gilbreth``, ``PF``)."""
    for prefix in ("Gilbreth", "PF", "MN", "D"):
        if source_id.startswith(prefix):
            return prefix
    raise ValueError(f"id={source_id!r}: no group for it")  # pragma: no cover - every entry has one


def get(source_id: str) -> Source:
    """The registered :class:`Source` of ``source_id``.

    Raises:
        ValueError: ``source_id`` is not registered; the message names it and where the list is.
    """
    try:
        return SOURCES[source_id]
    except KeyError:
        raise ValueError(f"source id {source_id!r} is not registered in helpers.sources.SOURCES "
                         f"(see docs/sources.md for the {len(SOURCES)} ids)") from None


def cite(source_id: str, *more: str) -> str:
    """A ``source`` string for a check or a docstring: each id with its public URLs.

    ``cite("MN4")`` -> ``"MN4 (https://github.com/moby/moby/issues/4378)"``; an id without a URL
    points at ``docs/sources.md``; several ids are joined with ``"; "``.

    Raises:
        ValueError: an unknown id (see :func:`get`).
    """
    parts = []
    for sid in (source_id, *more):
        src = get(sid)
        parts.append(f"{sid} ({', '.join(src.urls) if src.urls else 'docs/sources.md'})")
    return "; ".join(parts)


def render_markdown() -> str:
    """The text of ``docs/sources.md``: one table per group of :data:`SOURCES` (id, fact, links)."""
    lines = ["# Sources", "",
             "Every rule or threshold in `helpers/`, `notebooks/` and `configs/` cites one of these ids "
             "(`Check.source`, docstrings, notebook text).",
             "Each fact is written for this course; the links are the public pages behind it.", "",
             f"Generated from `helpers/sources.py` (do not edit by hand); regenerate with `{REGENERATE}`.", ""]
    for key, title in GROUPS:
        lines += [f"## {title}", "", "| id | fact | links |", "|---|---|---|"]
        for src in SOURCES.values():
            if _group(src.id) == key:
                links = " ".join(f"<{u}>" for u in src.urls) or "-"
                lines.append(f"| {src.id} | {src.fact.replace('|', '&#124;')} | {links} |")
        lines.append("")
    return "\n".join(lines)


_CITATION = re.compile(
    r"(?<![\w-])(?P<d>D[1-9]\d?)(?!\w|\.\d)"
    r"|(?<![\w-])(?P<mn>MN\d+)(?![\w])"
    r"|(?<![\w-])(?P<pf>PF-[a-z0-9]+(?:-[a-z0-9]+)*)"
    r"|(?i:gilbreth)(?:-hpc-guide(?:\.md)?|\s+guide)?(?:'s)?[\s,(]*(?:(?:§|section|sections)\s*)?(?P<g>\d{1,2}(?:\.\d{1,2})?)(?![\d.]\d)")


def unregistered(text: str) -> list[str]:
    """The seed-id-like citations in ``text`` that :data:`SOURCES` lacks (a test utility), sorted, no repeats.

    Recognised forms: ``D7``, ``MN4``, ``PF-<name>``, and a Gilbreth section after the guide's name
    (``Gilbreth 8.12``, ``Gilbreth §6.3``, ``Gilbreth guide section 5.3``: only
    the first number after the name).  Gilbreth forms are returned as ``Gilbreth N``.
    """
    found = set()
    for m in _CITATION.finditer(text):
        sid = m.group("d") or m.group("mn") or m.group("pf") or f"Gilbreth {m.group('g')}"
        if sid not in SOURCES:
            found.add(sid)
    return sorted(found)
