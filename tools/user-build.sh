#!/usr/bin/env bash
# Builds and vets each published nested module (the adapters, idemctl, the
# mixin)
# as a user who requires it resolves it: in a copy without its replace
# directives, against the version of the core its go.mod requires, which the
# go command fetches from this repository's git history as it would from
# GitHub (tools/modules.sh). It fails when a nested module builds only thanks
# to its replace: when it uses a part of the core that the required version
# does not have, or requires a version this repository has no commit or tag
# for. `make user-build` runs it, and so CI does; docs/releasing.md says what
# it proves and what it cannot.
#
#	tools/user-build.sh [CHECKOUT]
#
# CHECKOUT (default: this one) is the git checkout whose working tree holds
# the modules built and whose history and tags the core's versions come from.
set -euo pipefail
tools=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$tools/modules.sh"
cd "${1:-$tools/..}"
repo=$PWD

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go_from_git "$repo" "$tmp"

for m in "${published[@]}"; do
	copy="$tmp/$(basename "$m")"
	# The module's files as git sees them, committed or not (a module nested
	# under it is copied too, and ignored by the go command, as its zip does).
	mkdir -p "$copy"
	(cd "$m" && git ls-files --cached --others --exclude-standard -z . |
		while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
		tar --null -T - -cf -) | tar -C "$copy" -xf -
	(
		cd "$copy"
		required=$(go mod edit -json | jq -r --arg c "$core" '.Require[]? | select(.Path == $c) | .Version')
		echo ">>> $m: build and vet against $core ${required:-(not required)}, without replace"
		dropped=0
		for r in $(go mod edit -json | jq -r '.Replace[]?.Old.Path'); do
			case $r in "$core" | "$core"/*) go mod edit -dropreplace="$r" && dropped=$((dropped + 1)) ;; esac
		done
		if [ "$dropped" = 0 ]; then
			# A module without replace directives (cmd/idemctl builds against
			# the checkout through a go.work instead) is exactly what a user
			# resolves: its go.mod and go.sum must be tidy as they are.
			echo ">>> $m: go mod tidy -diff, as committed"
			go mod tidy -diff
		fi
		go build ./...
		go vet ./...
	)
	echo "ok: $m builds and vets as a user resolves it"
done
