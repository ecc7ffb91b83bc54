r"""Train the seq2seq family with Accelerate: parse the arguments, run the library loop.

    python scripts/train_seq2seq.py --output_dir outputs/seq2seq
    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no \
        scripts/train_seq2seq.py --output_dir outputs/seq2seq

`python scripts/train_seq2seq.py --help` lists every option (data, optimisation, checkpoints, Hub).
"""

import sys

from hf_vit_plus.training import parse_args
from hf_vit_plus.training.loop import train

if __name__ == "__main__":
    result = train(parse_args("seq2seq"))
    sys.exit(0 if result.stop_reason in ("finished", "stop_after_steps", "SIGTERM") else 1)
