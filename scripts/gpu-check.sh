#!/usr/bin/env bash
# gpu-check: the CUDA path on a real NVIDIA GPU, from a fresh clone, in under 5 minutes.
#
#   scripts/gpu-check.sh                  install, CUDA tests on the device, sweep vs SDPA
#   scripts/gpu-check.sh --simulator      the same path in Numba's CUDA simulator (no GPU)
#   scripts/gpu-check.sh --dry-run        say what would run, run nothing
#
# Steps (device mode):
#   1. find the GPU (nvidia-smi or /dev/nvidiactl); none: exit 2, nothing is measured;
#   2. make a venv (.venv-gpu, --system-site-packages so that a torch already on the
#      machine is seen) and pip install -e ".[test,cuda]" into it (skip with --python);
#   3. python -m attnbench.gpu_check --mode device with NUMBA_ENABLE_CUDASIM=0: the CUDA
#      tests on the device, the card's peaks, a short sweep of the cuda backend and of
#      PyTorch's SDPA on the GPU (when torch with CUDA is importable), results where
#      'attnbench report' loads them (default reports/gpu-check/), and a last line that
#      says whether it ran on the device or only in the simulator.
#
# Exit status: 0 all passed; 1 a test or a point failed; 2 usage, no GPU, or a mode that
# does not match the machine; 3 the install failed; 124 the time budget ran out.
set -uo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
usage: scripts/gpu-check.sh [--simulator] [--dry-run] [--out DIR] [--python PY | --venv DIR]
                            [--budget SECONDS]

Run the CUDA tests on an NVIDIA GPU (not the simulator) and a short sweep of the cuda
backend against PyTorch's SDPA on the GPU; write the results where 'attnbench report'
loads them. Meant for a fresh GPU machine: it installs attnbench[test,cuda] in a venv.

options:
  --simulator      run the same path in Numba's CUDA simulator (no GPU needed; tiny
                   sizes; the times are not GPU times, and the output says so)
  --dry-run        print the plan (mode, install, tests, sweep, results) and stop
  --out DIR        results folder (default: reports/gpu-check)
  --python PY      use this interpreter as it is (attnbench and numba-cuda installed):
                   no venv, no install
  --venv DIR       the venv to make or reuse (default: .venv-gpu)
  --budget S       seconds for everything, install included (default: 290)
  -h, --help       this help

exit status: 0 passed; 1 a test or a point failed; 2 usage error, no GPU, or a mode
that does not match the machine; 3 install failed; 124 out of time.
EOF
}

# value OPTION WHAT "$@": the option's value, or exit 2 saying what it needs.
value() {
  if [ $# -lt 4 ] || [ -z "$4" ]; then echo "gpu-check: $1 needs $2" >&2; exit 2; fi
  printf '%s' "$4"
}

mode=device dry_run=0 out=reports/gpu-check python="" venv=.venv-gpu budget=290
while [ $# -gt 0 ]; do
  case "$1" in
    --simulator) mode=simulator ;;
    --dry-run) dry_run=1 ;;
    --out) out="$(value --out "a folder" "$@")" || exit 2; shift ;;
    --python) python="$(value --python "an interpreter" "$@")" || exit 2; shift ;;
    --venv) venv="$(value --venv "a folder" "$@")" || exit 2; shift ;;
    --budget) budget="$(value --budget "seconds" "$@")" || exit 2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case "$budget" in ''|*[!0-9]*) echo "gpu-check: --budget must be whole seconds" >&2; exit 2 ;; esac

started=$SECONDS
remaining() { echo $(( budget - (SECONDS - started) )); }

# 1. Where can CUDA code run?
gpu=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu="$(nvidia-smi -L | head -n 1)"
elif [ -e /dev/nvidiactl ]; then
  gpu="an NVIDIA device node (/dev/nvidiactl), nvidia-smi not found"
fi
if [ "$mode" = device ]; then
  if [ -n "$gpu" ]; then
    echo "gpu-check: mode device: found $gpu"
  elif [ "$dry_run" = 1 ]; then
    echo "gpu-check: mode device, but no NVIDIA GPU here (no nvidia-smi, no /dev/nvidiactl)"
  else
    echo "gpu-check: no NVIDIA GPU here (no working nvidia-smi, no /dev/nvidiactl):" \
         "nothing ran on a device. Run with --simulator to exercise the path in Numba's" \
         "CUDA simulator." >&2
    exit 2
  fi
  export NUMBA_ENABLE_CUDASIM=0
else
  echo "gpu-check: mode simulator (Numba's CUDA simulator: no GPU is used${gpu:+, though $gpu is here})"
  export NUMBA_ENABLE_CUDASIM=1
fi

# 2. The environment.
if [ -n "$python" ]; then
  install="(none: --python $python as it is)"
else
  install="python3 -m venv --system-site-packages $venv && $venv/bin/pip install -e \".[test,cuda]\""
  python="$venv/bin/python"
fi

if [ "$dry_run" = 1 ]; then
  echo "plan:"
  echo "  install: $install"
  echo "  run: NUMBA_ENABLE_CUDASIM=$NUMBA_ENABLE_CUDASIM $python -m attnbench.gpu_check --mode $mode --out $out"
  if "$python" -c "import attnbench.gpu_check" >/dev/null 2>&1; then
    "$python" -m attnbench.gpu_check --mode "$mode" --out "$out" --dry-run | sed 's/^/  /'
  else
    echo "  (attnbench is not installed for $python yet: the checks' plan prints after the install)"
  fi
  echo "  time budget: ${budget} s in all"
  echo "dry run: nothing was installed or run."
  exit 0
fi

if [ "$install" != "(none: --python $python as it is)" ]; then
  echo "+ $install"
  if ! { [ -x "$python" ] || python3 -m venv --system-site-packages "$venv"; } \
     || ! timeout "$(( $(remaining) - 90 ))" "$venv/bin/pip" install -q -e ".[test,cuda]"; then
    echo "gpu-check: the install failed (see above); nothing ran" >&2
    exit 3
  fi
  echo "installed in $(( SECONDS - started )) s"
fi

# 3. The checks, within what is left of the budget (10 s kept for the report and exit).
left=$(( $(remaining) - 10 ))
if [ "$left" -lt 30 ]; then
  echo "gpu-check: only ${left} s left after the install: not enough to run the checks" >&2
  exit 124
fi
echo "+ NUMBA_ENABLE_CUDASIM=$NUMBA_ENABLE_CUDASIM $python -m attnbench.gpu_check --mode $mode --out $out --budget $(( left - 15 ))"
timeout "$left" "$python" -m attnbench.gpu_check --mode "$mode" --out "$out" --budget "$(( left - 15 ))"
status=$?
if [ "$status" = 124 ]; then
  echo "gpu-check: out of time after ${budget} s; partial results in $out (sweep.jsonl)" >&2
fi
echo "gpu-check: done in $(( SECONDS - started )) s, exit status $status"
exit "$status"
