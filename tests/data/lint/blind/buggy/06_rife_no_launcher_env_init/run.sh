# reporter: "Running `train_WIP.py` with default arg values"
python train_WIP.py
