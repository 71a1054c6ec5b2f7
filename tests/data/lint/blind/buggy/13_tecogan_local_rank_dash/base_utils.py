# excerpt of codes/utils/base_utils.py (skycrapers/TecoGAN-PyTorch @ 4eb5baa4)
import argparse


def parse_agrs():
    parser = argparse.ArgumentParser()
    parser.add_argument('--exp_dir', type=str, required=True,
                        help='directory of the current experiment')
    parser.add_argument('--mode', type=str, required=True,
                        help='which mode to use (train|test|profile)')
    parser.add_argument('--opt', type=str, required=True,
                        help='path to the config yaml file')
    parser.add_argument('--gpu_ids', type=str, default='-1',
                        help='GPU index (set -1 to use CPU)')
    parser.add_argument('--lr_size', type=str, default='3x256x256',
                        help='size of the input frame')
    parser.add_argument('--test_speed', action='store_true',
                        help='whether to test speed')
    parser.add_argument('--local_rank', default=-1, type=int,
                        help='local gpu index')
    return parser.parse_args()
