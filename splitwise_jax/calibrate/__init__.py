"""Calibrate the phase model on the measured profiles, and measure its held-out error.

One job per file:

* `rows`: the phase model evaluated on profile rows (what the profiles measure,
  predicted), `predict_frame` for a table of rows;
* `fit`: the fit itself (`FitConfig`, `fit`, `Fitted`, the outlier rules);
* `splits`: held-out splits (a) random, (b) extrapolation, (c) spec transfer, each
  fitted and predicted beside SplitwiseSim's interpolation (`evaluate_split`);
* `errors`: error tables of held-out predictions;
* `laplace`: the parameter uncertainty of a fit (Laplace covariance, residual scatter);
* `intervals`: prediction intervals of phase times and their held-out coverage;
* `report`, `cli`, `__main__`: the figure, the calibration/ README and
  `python -m splitwise_jax.calibrate`.

The parameter file's format has one home, `splitwise_jax.phases.params`
(`read_params_file`, `write_params_file`); `Fitted.load` and `Fitted.save` use it.

References:
    Patel et al., Splitwise, ISCA 2024, §III (the profiles, insights III-VII) and §V-A
    (SplitwiseSim's interpolating performance model, the baseline here).
"""

from splitwise_jax.calibrate.cli import main as main
from splitwise_jax.calibrate.errors import error_table as error_table
from splitwise_jax.calibrate.errors import markdown_tables as markdown_tables
from splitwise_jax.calibrate.errors import summary_table as summary_table
from splitwise_jax.calibrate.fit import BOUNDS as BOUNDS
from splitwise_jax.calibrate.fit import FIELDS as FIELDS
from splitwise_jax.calibrate.fit import FIT_START as FIT_START
from splitwise_jax.calibrate.fit import POWER_OUTLIER_FRACTION as POWER_OUTLIER_FRACTION
from splitwise_jax.calibrate.fit import FitConfig as FitConfig
from splitwise_jax.calibrate.fit import Fitted as Fitted
from splitwise_jax.calibrate.fit import fit as fit
from splitwise_jax.calibrate.fit import outlier_ids as outlier_ids
from splitwise_jax.calibrate.intervals import coverage_table as coverage_table
from splitwise_jax.calibrate.intervals import predict_intervals as predict_intervals
from splitwise_jax.calibrate.laplace import laplace as laplace
from splitwise_jax.calibrate.fit import power_outliers as power_outliers
from splitwise_jax.calibrate.report import plot_predicted_vs_measured as plot_predicted_vs_measured
from splitwise_jax.calibrate.rows import GroupData as GroupData
from splitwise_jax.calibrate.rows import RowPredictions as RowPredictions
from splitwise_jax.calibrate.rows import gpu_of_hardware as gpu_of_hardware
from splitwise_jax.calibrate.rows import predict_frame as predict_frame
from splitwise_jax.calibrate.rows import predict_rows as predict_rows
from splitwise_jax.calibrate.rows import stack_machines as stack_machines
from splitwise_jax.calibrate.splits import SPLIT_LABELS as SPLIT_LABELS
from splitwise_jax.calibrate.splits import SPLITS as SPLITS
from splitwise_jax.calibrate.splits import evaluate_split as evaluate_split
from splitwise_jax.calibrate.splits import split_extrapolation as split_extrapolation
from splitwise_jax.calibrate.splits import split_random as split_random
from splitwise_jax.calibrate.splits import split_spec_transfer as split_spec_transfer
