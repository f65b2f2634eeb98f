#!/usr/bin/env bash
# Moves every nested module's requirement of the core (and of any other
# module of this repository) to the version the go command gives commit REV
# (default HEAD): a pseudo-version, or the tag REV points at. Use it when a
# nested module starts using a part of the core that its required version
# lacks (make user-build fails then); commit the core's change first, since
# the requirement names a commit. `make require-core [REV=…]` runs it.
#
#	tools/require-core.sh [REV]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
rev=$(git rev-parse --verify "${1:-HEAD}^{commit}")
source tools/modules.sh

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(
	go_from_git "$root" "$tmp"
	pseudo_version "$rev"
) >"$tmp/version"
version=$(cat "$tmp/version")
echo ">>> $core $version (commit $rev)"
for m in $(nested_modules); do
	(
		cd "$m"
		for p in $(go mod edit -json | jq -r --arg c "$core" '.Require[]?.Path | select(. == $c or startswith($c + "/"))'); do
			go mod edit -require="$p@$version"
		done
		if [ -f go.work ]; then
			# No replace directives (cmd/idemctl): go mod tidy ignores the
			# workspace, so it resolves the required versions from this
			# repository's history, as the go command will from GitHub.
			go_from_git "$root" "$tmp"
		fi
		go mod tidy
	)
	echo "ok: $m requires $core $version"
done
