#!/usr/bin/env bash
# Keeps the shared target dir (scripts/bootstrap.sh: one per machine, outside the clone, so CI
# reuses RocksDB's compiled C++) from filling the disk. Every build of a changed rockq leaves
# its test binaries, examples, rlibs and incremental caches beside the old ones, and cargo never
# removes the old ones: over a few days of CI runs that was tens of gigabytes, and a CI run
# failed with "No space left on device".
#
# When the disk holding the target dir has less than ROCKQ_PRUNE_BELOW_GIB free (default 40),
# this removes, oldest first:
#   1. the incremental caches (rebuilt on demand; a build after a prune is a full rockq build,
#      a few minutes, never a RocksDB one);
#   2. rockq's own superseded artifacts: for each test, bench, example and binary name, every
#      build but the newest two (two: a test built with two feature sets is current twice).
# Never touched: dependencies' artifacts and build-script outputs (librocksdb-sys's compiled
# RocksDB above all), so a prune never costs a RocksDB compile.
# Sourced-safe: sourced by scripts/bootstrap.sh, it sets no shell options and defines nothing
# but `rockq_prune_cache`.

rockq_prune_cache() {
  local target="$1" below_gib="${ROCKQ_PRUNE_BELOW_GIB:-40}"
  [ -d "$target" ] || return 0
  local free_kib
  free_kib=$(df -Pk "$target" 2>/dev/null | awk 'NR == 2 { print $4 }')
  [ -n "$free_kib" ] || return 0
  [ "$free_kib" -lt $((below_gib * 1024 * 1024)) ] || return 0
  echo "prune-cache: $((free_kib / 1024 / 1024)) GiB free (< $below_gib): pruning $target" >&2

  local profile
  for profile in debug release; do
    rm -rf "$target/$profile/incremental"
  done

  # Names of rockq's own artifacts: this clone's targets (tests, benches, examples, binaries,
  # the library). Dependency artifacts never match: their names are their crate names.
  local root names
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  names=$(
    {
      echo rockq
      for dir in tests benches examples; do
        find "$root/$dir" -maxdepth 1 -name '*.rs' -printf '%f\n' 2>/dev/null | sed 's/\.rs$//'
        find "$root/$dir" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' 2>/dev/null
      done
      find "$root/src/bin" -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sed 's/\.rs$//'
    } | tr '-' '_' | sort -u
  )

  local dir name
  for profile in debug release; do
    for dir in "$target/$profile/deps" "$target/$profile/examples"; do
      [ -d "$dir" ] || continue
      for name in $names; do
        # Executables `name-<hash>` and libraries `libname-<hash>.{rlib,rmeta}`, newest first;
        # keep two of each kind, delete the rest with their `.d` files.
        local pattern
        for pattern in "$name-????????????????" "lib$name-????????????????.rlib" \
          "lib$name-????????????????.rmeta"; do
          find "$dir" -maxdepth 1 -type f -name "$pattern" -printf '%T@ %p\n' \
            | sort -rn | tail -n +3 | cut -d' ' -f2- \
            | while read -r file; do
              # Its dep-info file: `name-<hash>.d`, `libname-<hash>.d` for the libraries.
              local base="${file##*/}"
              rm -f "$file" "$dir/${base%%.r*}.d"
            done
        done
      done
    done
  done
  free_kib=$(df -Pk "$target" | awk 'NR == 2 { print $4 }')
  echo "prune-cache: $((free_kib / 1024 / 1024)) GiB free after pruning" >&2
}
