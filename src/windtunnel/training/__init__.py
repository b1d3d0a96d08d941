"""Training: the loop (:mod:`.trainer`), checkpoints (:mod:`.checkpoint`), learning-rate
schedules (:mod:`.schedule`) and multi-process set-up (:mod:`.distributed`).

    from windtunnel.training.trainer import train
"""
