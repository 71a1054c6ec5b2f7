#  Copyright (c) Prior Labs GmbH 2026.

"""Example of fine-tuning a TabPFN regressor using the FinetunedTabPFNRegressor wrapper.

Note: We recommend running the fine-tuning script on a CUDA-enabled GPU with 80 GB of VRAM.

Multi-GPU: torchrun --nproc-per-node=N examples/finetune_regressor.py
Note: Only call fit() once per torchrun session. For multiple finetuning runs, use
separate torchrun invocations.
"""

import gc
import logging
import os
import warnings

import sklearn.datasets
import torch
import torch.distributed as dist
from sklearn.metrics import mean_squared_error, r2_score
from sklearn.model_selection import train_test_split

from tabpfn import TabPFNRegressor
from tabpfn.finetuning import main_process_first
from tabpfn.finetuning.finetuned_regressor import FinetunedTabPFNRegressor

warnings.filterwarnings(
    "ignore",
    category=FutureWarning,
    module=r"google\.api_core\._python_version_support",
)

logging.basicConfig(
    level=logging.INFO,
    format="%(asctime)s - %(levelname)s - %(message)s",
)

# =============================================================================
# Fine-tuning Configuration
# For details and more options see FinetunedTabPFNRegressor
#
# These settings work well for the California Housing dataset.
# For other datasets, you may need to adjust these settings to get good results.
# =============================================================================

# Training hyperparameters
NUM_EPOCHS = 100
LEARNING_RATE = 1e-5

# Small meta-dataset chunks give several optimizer steps per epoch with varied
# contexts. On a dataset this size (~18.6k rows), fine-tuning overfits within a
# few epochs; diverse small contexts delay that, and early stopping (on the
# validation MSE) picks the checkpoint just before it sets in.
N_FINETUNE_CTX_PLUS_QUERY_SAMPLES = 5_000

# Ensemble configuration
# number of estimators to use during finetuning
NUM_ESTIMATORS_FINETUNE = 8
# number of estimators to use during train time validation
NUM_ESTIMATORS_VALIDATION = 8
# number of estimators to use during final inference
NUM_ESTIMATORS_FINAL_INFERENCE = 8

# early stopping patience
EARLY_STOPPING_PATIENCE = 15

# Reproducibility
RANDOM_STATE = 0


def main() -> None:
    is_main_process = int(os.environ.get("LOCAL_RANK", "0")) == 0

    # Under torchrun, the main process downloads the dataset first and the
    # other ranks then read it from the warm sklearn cache — otherwise every
    # rank would download it, and not all sklearn fetchers write their cache
    # atomically.
    with main_process_first():
        data = sklearn.datasets.fetch_california_housing(as_frame=True)

    X_all = data.data
    y_all = data.target

    X_train, X_test, y_train, y_test = train_test_split(
        X_all, y_all, test_size=0.1, random_state=RANDOM_STATE
    )

    if is_main_process:
        print(
            f"Loaded {len(X_train):,} samples for training and "
            f"{len(X_test):,} samples for testing."
        )

        # 2. Initial model evaluation on test set
        base_reg = TabPFNRegressor(
            device=[f"cuda:{i}" for i in range(torch.cuda.device_count())],
            n_estimators=NUM_ESTIMATORS_FINAL_INFERENCE,
            ignore_pretraining_limits=True,
        )
        base_reg.fit(X_train, y_train)

        base_pred = base_reg.predict(X_test)
        mse = mean_squared_error(y_test, base_pred)
        r2 = r2_score(y_test, base_pred)

        print(f"📊 Default TabPFN Test MSE: {mse:.4f}")
        print(f"📊 Default TabPFN Test R²: {r2:.4f}\n")

        del base_reg
        gc.collect()
        torch.cuda.empty_cache()

    # 3. Initialize and run fine-tuning
    if is_main_process:
        print("--- 2. Initializing and Fitting Model ---\n")

    # Instantiate the wrapper with your desired hyperparameters
    # To enable WandB logging, pass an experiment_logger:
    # .  from tabpfn.finetuning.logging import WandbLogger
    #   experiment_logger=WandbLogger(project="my-project", run_name="my-run", entity="my-entity")
    finetuned_reg = FinetunedTabPFNRegressor(
        device="cuda",
        epochs=NUM_EPOCHS,
        learning_rate=LEARNING_RATE,
        lr_warmup_only=True,
        random_state=RANDOM_STATE,
        n_finetune_ctx_plus_query_samples=N_FINETUNE_CTX_PLUS_QUERY_SAMPLES,
        n_estimators_finetune=NUM_ESTIMATORS_FINETUNE,
        n_estimators_validation=NUM_ESTIMATORS_VALIDATION,
        n_estimators_final_inference=NUM_ESTIMATORS_FINAL_INFERENCE,
        early_stopping_patience=EARLY_STOPPING_PATIENCE,
    )

    # 4. Call .fit() to start the fine-tuning process on the training data
    finetuned_reg.fit(X_train.values, y_train.values)

    # 5. Evaluate the fine-tuned model
    if is_main_process:
        print("\n--- 3. Evaluating Model on Held-out Test Set ---\n")
        y_pred = finetuned_reg.predict(X_test.values)

        mse = mean_squared_error(y_test, y_pred)
        r2 = r2_score(y_test, y_pred)

        print(f"📊 Finetuned TabPFN Test MSE: {mse:.4f}")
        print(f"📊 Finetuned TabPFN Test R²: {r2:.4f}")

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    if not torch.cuda.is_available():
        raise RuntimeError(
            "CUDA is not available. Please run the script on a CUDA-enabled GPU."
        )
    main()
