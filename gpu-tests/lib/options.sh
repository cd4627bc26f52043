# The command line of the gpu-tests and benchmarks scripts (sourced; no commands of its own).

# parse_options ON_ERROR SPEC... -- ARG...: reads the script's arguments ARG... by the SPECs:
# `--name=VAR` takes a value (`--name VALUE` sets VAR to VALUE), `--name=VAR=VALUE` is a switch
# (`--name` sets VAR to VALUE). An argument no SPEC names runs `ON_ERROR ARG` (ON_ERROR: a command
# and its first words, which says how the script is used and exits 2); an option whose value is
# missing or empty is named and the script exits 2.
parse_options() {
    local on_error=$1 specs=() spec target
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        specs+=("$1")
        shift
    done
    shift
    while [ $# -gt 0 ]; do
        target=
        for spec in "${specs[@]}"; do
            if [ "${spec%%=*}" = "$1" ]; then
                target=${spec#*=}
                break
            fi
        done
        if [ -z "$target" ]; then
            $on_error "$1"
            exit 2
        elif [ "${target#*=}" != "$target" ]; then
            printf -v "${target%%=*}" '%s' "${target#*=}"
            shift
        elif [ -z "${2:-}" ]; then
            echo "$(basename "$0"): $1 needs a value" >&2
            exit 2
        else
            printf -v "$target" '%s' "$2"
            shift 2
        fi
    done
}

# help_or_unknown SCRIPT ARG: the ON_ERROR of the scripts whose usage() prints their help and exits
# with its argument (default 2): -h and --help print the help and exit 0, anything else is named
# (as SCRIPT's unknown argument) before it.
help_or_unknown() {
    case $2 in -h | --help) usage 0 ;; esac
    echo "$1: unknown argument $2" >&2
    usage
}

# absolute_dist_out: DIST and OUT made absolute paths, OUT created first.
absolute_dist_out() {
    DIST=$(cd "$DIST" && pwd)
    mkdir -p "$OUT"
    OUT=$(cd "$OUT" && pwd)
}
