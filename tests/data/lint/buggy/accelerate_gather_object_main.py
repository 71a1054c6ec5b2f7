# Source: https://github.com/huggingface/accelerate/issues/2733
# Confirmed cause: gather_object called only under is_main_process hangs; maintainer: it must be called on every worker
# Expected rule(s): rank-gated-collective
from accelerate import Accelerator
from accelerate.utils import gather_object
distributed_state = Accelerator()
txt_out = grade(inputs)
if distributed_state.is_main_process:
    print(gather_object(txt_out)[0])
    print(gather_object(txt_out)[1])
