#!/usr/bin/env bash
# netns_hosts.sh: N "hosts" on this machine for multi-host tests (docs/deploy.md "A test bed of
# hosts"). Each host is a Linux network namespace with its own loopback (up) and one interface,
# eth0, on a private subnet of the test bed's own (10.213.X.0/24); the interfaces meet on a
# bridge in the root namespace, which holds .1 so the root namespace reaches every host. Traffic
# between hosts is real TCP between distinct addresses; nothing is routed anywhere else.
#
#   netns_hosts.sh up N [--prefix P] [--owner PID]   make hosts P-h0 .. P-h<N-1>
#   netns_hosts.sh down P                            remove bed P: its processes, namespaces, links
#   netns_hosts.sh gc                                remove every bed whose owner process is gone
#   netns_hosts.sh check                             exit 0 if beds can be made here, else say why
#
# `up` prints, one a line:
#   prefix P            subnet 10.213.X.0/24        bridge PBR 10.213.X.1
#   host I P-hI 10.213.X.<I+2> eth0
# Names start with the prefix (default pdmh<owner pid>; at most 11 characters, interface names
# have 15), so concurrent beds never collide; the subnet is picked under a lock among those no
# interface of this machine uses. The owner (default: the caller, $PPID) is recorded: `gc`
# (which `up` runs first) removes the beds of owners that died without `down` (a killed test).
# A failing `up` removes what it made before exiting. Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN)
# and iproute2's `ip`; exits 2 with the reason when they are missing.
set -euo pipefail

STATE=/run/pdserve-netns
die() { echo "netns_hosts.sh: $*" >&2; exit 1; }
cannot() { echo "netns_hosts.sh: cannot make network namespaces here: $*" >&2; exit 2; }

check() {
  command -v ip >/dev/null 2>&1 || cannot "iproute2's 'ip' is not installed"
  [ "$(id -u)" = 0 ] || cannot "not root (needs CAP_NET_ADMIN and CAP_SYS_ADMIN)"
  mkdir -p "$STATE" 2>/dev/null || cannot "cannot create $STATE"
  local probe="pdmhprobe$$" exec_err
  # 'ip netns exec' makes a mount namespace whose / is a slave mount: in a chroot whose / is
  # not a mount point that fails, and no host of the bed could run anything. Probe it before
  # 'ip netns add', which would leave /run/netns bind-mounted in such a chroot.
  if command -v unshare >/dev/null 2>&1 && ! exec_err=$(unshare --mount sh -c 'mount --make-rslave /' 2>&1); then
    cannot "a new mount namespace cannot make / a slave mount: ${exec_err//$'\n'/ } (a chroot whose / is not a mount point cannot run commands in a network namespace)"
  fi
  ip netns add "$probe" 2>/dev/null || cannot "'ip netns add' failed (no CAP_SYS_ADMIN, or /run/netns not writable)"
  if ! exec_err=$(ip netns exec "$probe" true 2>&1); then
    ip netns del "$probe"
    cannot "'ip netns exec' failed: ${exec_err//$'\n'/ } (a chroot whose / is not a mount point cannot run commands in a namespace)"
  fi
  ip link add "${probe:0:15}" type bridge 2>/dev/null || { ip netns del "$probe"; cannot "'ip link add type bridge' failed (no CAP_NET_ADMIN)"; }
  ip link del "${probe:0:15}"
  ip netns del "$probe"
}

# Removes bed $1: SIGTERM then SIGKILL to every process in its namespaces, the namespaces (and
# with them the veth ends inside), every link whose name starts with the prefix, the state file.
down() {
  local p=$1 ns pids link
  [ -n "$p" ] || die "down: no prefix"
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${p}-h" || true); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -TERM $pids 2>/dev/null || true
  done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${p}-h" || true); do
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      [ -z "$pids" ] && break
      sleep 0.1
    done
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^${p}" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  rm -f "$STATE/$p"
}

gc() {
  local f p owner
  [ -d "$STATE" ] || return 0
  for f in "$STATE"/pdmh*; do
    [ -e "$f" ] || continue
    p=$(basename "$f")
    owner=$(awk '/^owner /{print $2}' "$f")
    if [ -z "$owner" ] || ! kill -0 "$owner" 2>/dev/null; then
      echo "netns_hosts.sh: removing bed $p (owner ${owner:-?} is gone)" >&2
      down "$p"
    fi
  done
}

up() {
  local n=$1; shift
  local owner=$PPID p=""
  while [ $# -gt 0 ]; do
    case $1 in
      --prefix) p=$2; shift 2 ;;
      --owner) owner=$2; shift 2 ;;
      *) die "up: unknown option $1" ;;
    esac
  done
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 60 ] || die "up: N must be in [1, 60]"
  [ -n "$p" ] || p="pdmh${owner}"
  [[ "$p" =~ ^pdmh[a-z0-9]{0,7}$ ]] || die "up: the prefix must be pdmh + at most 7 of [a-z0-9] (got '$p')"
  check
  gc
  exec 9>"$STATE/lock"
  flock 9
  [ ! -e "$STATE/$p" ] || die "up: bed $p exists (down it first)"
  # A /24 no interface of the root namespace and no other bed uses.
  local used x="" k
  used=$( { ip -4 -o addr show 2>/dev/null | grep -o '10\.213\.[0-9]*\.' || true; cat "$STATE"/pdmh* 2>/dev/null | awk '/^subnet /{print $2}' || true; } | cut -d. -f3 | sort -u)
  for k in $(seq 0 249); do
    local cand=$(( (owner + k) % 250 + 1 ))
    if ! grep -qx "$cand" <<<"$used"; then x=$cand; break; fi
  done
  [ -n "$x" ] || die "up: no free 10.213.X.0/24 subnet"
  printf 'owner %s\nsubnet 10.213.%s.0/24\n' "$owner" "$x" >"$STATE/$p"
  flock -u 9
  trap 'echo "netns_hosts.sh: up failed; removing bed '"$p"'" >&2; down '"$p"'; exit 1' ERR
  local br="${p}br"
  ip link add "$br" type bridge
  # Bridged frames skip the host's iptables (br_netfilter may be loaded by a container runtime
  # whose FORWARD policy would drop them); the hosts talk as on a plain switch.
  ip link set "$br" type bridge nf_call_iptables 0 nf_call_ip6tables 0 nf_call_arptables 0 2>/dev/null || true
  ip addr add "10.213.${x}.1/24" dev "$br"
  ip link set "$br" up
  echo "prefix $p"
  echo "subnet 10.213.${x}.0/24"
  echo "bridge $br 10.213.${x}.1"
  local i ns v
  for i in $(seq 0 $((n - 1))); do
    ns="${p}-h${i}"
    v="${p}v${i}"
    ip netns add "$ns"
    ip link add "$v" type veth peer name "${p}p${i}"
    ip link set "${p}p${i}" netns "$ns"
    ip -n "$ns" link set "${p}p${i}" name eth0
    ip -n "$ns" addr add "10.213.${x}.$((i + 2))/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip link set "$v" master "$br"
    ip link set "$v" up
    echo "host $i $ns 10.213.${x}.$((i + 2)) eth0"
  done
  trap - ERR
}

cmd=${1:-}
shift || true
case $cmd in
  up) [ $# -ge 1 ] || die "usage: up N [--prefix P] [--owner PID]"; up "$@" ;;
  down) [ $# -eq 1 ] || die "usage: down PREFIX"; down "$1" ;;
  gc) gc ;;
  check) check; echo "ok" ;;
  *) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; [ -z "$cmd" ] || [ "$cmd" = help ] || exit 1 ;;
esac
