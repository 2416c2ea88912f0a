"""The seed paper's four models (Neubig, Goldberg and Dyer 2017), each written for ONE instance
and batched by autobatch: ``tree_lstm``, ``bilstm_tagger``, ``char_tagger`` and ``parser``.

Every model comes in two forms over the same parameters: primitive ops (one IR node per op)
and cells (one IR node per LSTM step / Tree-LSTM node / MLP). Run one with
``python -m autobatch.examples.tree_lstm --help``.
"""
