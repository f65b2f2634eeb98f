#!/usr/bin/env bash
# Releases the core and every published nested module in lockstep, as one
# version (docs/releasing.md): moves each nested module's requirement of the
# core to VERSION, runs go mod tidy in each (the replace directives stay: Go
# ignores them in a dependency, and they keep a checkout building against
# itself), builds and vets each nested module as a user resolves it against
# the new tags, commits, and tags VERSION and <module>/VERSION for each
# published nested module (tools/modules.sh): idemgrpc, idemconnect, idemgin,
# idemecho, idemwatermill, idempg, cmd/idemctl and observability/mixin.
# cmd/idemctl, which has no replace directives (a go.work builds it against
# the checkout), moves in a second commit that requires the first one's
# tags. Pushing is left to you; the script prints the command. `make release VERSION=vX.Y.Z` runs it.
#
#	tools/release.sh [-n] VERSION
#
# -n (make release-dry-run) changes nothing here: it does all of it in a
# throwaway clone of HEAD (commit, tags, the user build against them), prints
# every command, the commit's diff and the tags, and removes the clone. Without
# VERSION it takes the next minor version after the newest tag. The real run
# refuses a dirty tree, a VERSION that is not vMAJOR.MINOR.PATCH, a tag that
# exists, and runs make test first (SKIP_TESTS=1 skips it).
set -euo pipefail
tools=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$tools/.."
root=$PWD
source "$tools/modules.sh"

dry=0
if [ "${1:-}" = -n ]; then
	dry=1
	shift
fi
version=${1:-}
if [ -z "$version" ] && [ "$dry" = 1 ]; then
	latest=$(git tag --list 'v*' --sort=-v:refname | grep -E '^v[0-9]+\.[0-9]+\.[0-9]+$' | head -1 || true)
	if [ -z "$latest" ]; then
		version=v0.1.0
	else
		IFS=. read -r major minor _ <<<"${latest#v}"
		version=v$major.$((minor + 1)).0
	fi
fi
fail() {
	echo "release: $*" >&2
	exit 1
}
[ -n "$version" ] || fail "usage: tools/release.sh [-n] vMAJOR.MINOR.PATCH"
[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "$version is not vMAJOR.MINOR.PATCH"
# A v2 or later needs a /v2 module path in every go.mod, which this script
# does not rewrite.
[[ $version =~ ^v[01]\. ]] || fail "$version needs a /v${version:1:1} module path first"
# The modules that build against the checkout through a go.work instead of
# replace directives (cmd/idemctl): they require the other modules' new tags,
# so they move in a second commit, after those tags exist.
workspace=()
tags=("$version")
for m in "${published[@]}"; do
	if [ -f "$m/go.work" ]; then
		workspace+=("$m")
	else
		tags+=("$m/$version")
	fi
done
late_tags=()
for m in ${workspace[@]+"${workspace[@]}"}; do
	late_tags+=("$m/$version")
done
for t in "${tags[@]}" ${late_tags[@]+"${late_tags[@]}"}; do
	if git rev-parse -q --verify "refs/tags/$t" >/dev/null; then
		fail "tag $t exists"
	fi
done

run() {
	echo "+ $(printf '%q ' "$@")"
	"$@"
}

if [ "$dry" = 1 ]; then
	if [ -n "$(git status --porcelain)" ]; then
		echo "release: the tree has uncommitted changes; the dry run releases HEAD without them (a real run refuses)"
	fi
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	echo ">>> dry run of the release of $version, in a clone of HEAD ($(git rev-parse --short HEAD)); this checkout is not changed"
	echo "+ make test (skipped in a dry run)"
	git clone -q --no-local "$root" "$tmp/repo"
	git -C "$tmp/repo" checkout -q --detach "$(git rev-parse HEAD)"
	cd "$tmp/repo"
	# Tags of the clone only; none is pushed anywhere.
	git config user.name >/dev/null || git config user.name "release dry run"
	git config user.email >/dev/null || git config user.email "release-dry-run@localhost"
else
	[ -z "$(git status --porcelain)" ] || fail "the tree has uncommitted changes"
	git symbolic-ref -q HEAD >/dev/null || fail "HEAD is detached: release from a branch"
	if [ "${SKIP_TESTS:-0}" != 1 ]; then
		run make test
	fi
fi

start=$(git rev-parse HEAD)
echo ">>> require $core $version in every nested module"
for m in $(nested_modules); do
	[ -f "$m/go.work" ] && continue
	(
		cd "$m"
		for p in $(go mod edit -json | jq -r --arg c "$core" '.Require[]?.Path | select(. == $c or startswith($c + "/"))'); do
			run go mod edit -require="$p@$version"
		done
		echo "+ (cd $m && go mod tidy)"
		go mod tidy
	)
done
run git add -u -- $(nested_modules)
if git diff --cached --quiet; then
	echo ">>> the nested modules already require $version: no commit"
else
	run git commit -q -m "Release $version: the nested modules require the core at $version"
fi
for t in "${tags[@]}"; do
	run git tag -a "$t" -m "$t"
done

# The workspace modules require the tags just made; go mod tidy resolves them
# from this repository, as the go command will from GitHub.
for m in ${workspace[@]+"${workspace[@]}"}; do
	echo ">>> require $core $version in $m, against the new tags"
	(
		cd "$m"
		for p in $(go mod edit -json | jq -r --arg c "$core" '.Require[]?.Path | select(. == $c or startswith($c + "/"))'); do
			run go mod edit -require="$p@$version"
		done
		wtmp=$(mktemp -d)
		trap 'rm -rf "$wtmp"' EXIT
		go_from_git "$(git rev-parse --show-toplevel)" "$wtmp"
		echo "+ (cd $m && go mod tidy)"
		go mod tidy
	)
	run git add -- "$m/go.mod" "$m/go.sum"
done
if [ "${#late_tags[@]}" -gt 0 ]; then
	if git diff --cached --quiet; then
		echo ">>> ${workspace[*]} already require $version: no commit"
	else
		run git commit -q -m "Release $version: the workspace modules (${workspace[*]}) require the core at $version"
	fi
	for t in "${late_tags[@]}"; do
		run git tag -a "$t" -m "$t"
	done
	tags+=("${late_tags[@]}")
fi

# The user build against the new tags, from this repository: proves each
# published module resolves with its replace dropped before anything is
# pushed.
echo ">>> build and vet the nested modules as a user resolves them, against the new tags"
bash "$tools/user-build.sh" "$PWD"

if [ "$dry" = 1 ]; then
	echo ">>> the release commits"
	git log --stat --format='%h %s' "$start..HEAD"
	git log -p --format='%h' "$start..HEAD" -- '*.mod'
	echo ">>> the tags"
	for c in $(git rev-list "$start..HEAD"); do git tag --list --points-at "$c"; done
	echo ">>> dry run done: nothing changed in $root"
else
	echo ">>> released $version; push the commit and the tags together:"
	echo "    git push origin HEAD ${tags[*]}"
fi
