-- Zeus train trace: the epoch at which each (config, learning rate, seed) reached its target metric
-- (NULL: never reached). GPU-independent; time-to-accuracy = target_epoch x time_per_epoch_s of the sweep.
select
    cast(dataset as varchar) as dataset,
    cast(network as varchar) as network,
    cast(network as varchar) || '/' || cast(dataset as varchar) as workload,
    cast(batch_size as integer) as batch_size,
    cast(optimizer as varchar) as optimizer,
    cast(learning_rate as double) as learning_rate,
    cast(run as integer) as run,
    cast(target_metric as double) as target_metric,
    cast(target_epoch as double) as target_epoch,
    _loaded_at as loaded_at
from {{ source('raw', 'zeus_train_summary') }}
