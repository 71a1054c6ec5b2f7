# excerpt of mlpf/pyg/training.py (jpata/particleflow @ 233a789a43ca5d527bcfcd4bb0e01710939bdc0e); omitted ranges marked
import json
import pickle as pkl
import time
from typing import Optional

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.distributed as dist
import tqdm
from torch import Tensor, nn
from torch.nn import functional as F
# [...]
@torch.no_grad()
def validation_run(rank, model, train_loader, valid_loader, tensorboard_writer=None):
    with torch.no_grad():
        optimizer = None
        ret = train(rank, model, train_loader, valid_loader, optimizer, tensorboard_writer)
    return ret


def train(rank, model, train_loader, valid_loader, optimizer, tensorboard_writer=None):
    """
    A training/validation run over a given epoch that gets called in the train_mlpf() function.
    When optimizer is set to None, it freezes the model for a validation_run.
    """
    global ISTEP_GLOBAL_TRAIN, ISTEP_GLOBAL_VALID
    is_train = not (optimizer is None)

    loss_obj_id = FocalLoss(gamma=2.0)

    if is_train:
        _logger.info(f"Initiating a training run on device {rank}", color="red")
        step_type = "train"
        loader = train_loader
        model.train()
    else:
        _logger.info(f"Initiating a validation run on device {rank}", color="red")
        step_type = "valid"
        loader = valid_loader
        model.eval()

# [...]
        # make mlpf forward pass
        # t0 = time.time()
        pred_ids_one_hot, pred_momentum, pred_charge = model(event)
        # print(f"{event}: {(time.time() - t0):.2f}s")
# [...]
def train_mlpf(rank, world_size, model, train_loader, valid_loader, n_epochs, patience, lr, outpath):
    """
# [...]

        # training step
        losses_t = train(rank, model, train_loader, valid_loader, optimizer, tensorboard_writer)
        # with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        #     with record_function("model_train"):
        # print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20))

        for k, v in losses_t.items():
            tensorboard_writer.add_scalar(f"epoch/train_loss_rank_{rank}_" + k, v, epoch)
        for loss in losses_of_interest:
            losses["train"][loss].append(losses_t[loss])

        # validation step on a single machine
        if (rank == 0) or (rank == "cpu"):
            if world_size > 1:
                dist.barrier()

            losses_v = validation_run(rank, model, train_loader, valid_loader, tensorboard_writer)
            for loss in losses_of_interest:
                losses["valid"][loss].append(losses_v[loss])
            for k, v in losses_v.items():
                tensorboard_writer.add_scalar("epoch/valid_loss_" + k, v, epoch)

            tensorboard_writer.flush()

            if world_size > 1:
                dist.barrier()

            # save the lowest value of each component of the loss to print it on the legend of the loss plots
