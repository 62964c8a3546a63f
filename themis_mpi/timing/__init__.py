"""The timing core: how long a stage takes, on one NPU's links or on every NPU's (docs/design.md#timing).

Rules (`links.LinkModel`, one module each, named in `rules`): `ideal` (shares nothing: the cost
model alone), `fair` (max-min fair), `store_forward` (a FIFO of whole transfers per link, ASTRA-sim
2.x's link under its compat), and `replay` (recorded ends). What runs them: `symmetric` (one NPU
stands for all), `greenlets`, `world` and `vectors` (every NPU), chosen by `planner`. `routes`
says which links a stage's steps and a message cross; `events` is the one event loop a container
and its rule share.
"""
