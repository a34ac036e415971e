// The process that launched this rank (torchrun, srun, mpirun or a shell).
#pragma once

namespace zero {

// Whether the launcher has exited since the process group was set up: this process was
// re-parented, or under torchrun the elastic agent, however many wrapper processes lie between
// it and this rank (torchrun --no-python run.sh), is gone. A training loop checks it between steps
// so that ranks whose launcher is gone stop, after a last checkpoint, instead of training on
// unsupervised. False for a single-rank run, which never records its launcher.
bool launcher_exited();
// The launcher's process id as recorded at set-up; 0 when none was recorded.
int launcher_pid();

}  // namespace zero
