# Sourced by tools/user-build.sh, tools/require-core.sh and
# tools/release.sh: the repository's modules, and a go environment that
# resolves them from a git repository on disk as the go command resolves them
# from GitHub (docs/releasing.md).

# The core's module path; every nested module's path starts with it.
core=github.com/idemkit/idempotency

# The nested modules a user can require: released in lockstep with the core,
# each tagged <dir>/vX.Y.Z.
published=(idemgrpc idemconnect idemgin idemecho idemwatermill idempg cmd/idemctl observability/mixin)

# Every nested module, also those no one requires (the mixin's checks, a
# module of their own so that their dependencies stay out of the mixin's):
# their requirements move with the others, they are not tagged.
nested_modules() {
	git ls-files '*/go.mod' | xargs -n1 dirname | sort
}

# go_from_git REPO DIR: sets, for the go commands that follow, an environment
# in which the modules under $core come from the git repository REPO (its
# commits and tags, as the go command reads them from
# https://github.com/idemkit/idempotency) and every other module from the
# local module cache or the Go module proxy. The module cache is a new one
# under DIR, so that a version resolved here (a tag of a dry run, say) never
# lands in the real cache; the real cache serves as a proxy for what it holds,
# so nothing already downloaded is fetched again.
go_from_git() {
	local repo=$1 dir=$2 cache
	cache=$(go env GOMODCACHE)
	cat >"$dir/gitconfig" <<GITCONFIG
[url "file://$repo"]
	insteadOf = https://$core
[protocol "file"]
	allow = always
GITCONFIG
	export GIT_CONFIG_GLOBAL="$dir/gitconfig" GIT_CONFIG_NOSYSTEM=1
	export GOPRIVATE=$core GONOSUMDB=$core
	export GOMODCACHE="$dir/modcache"
	export GOPROXY="file://$cache/cache/download,$(go env GOPROXY)"
	export GOFLAGS="-mod=mod -modcacherw -trimpath"
	export GOWORK=off
}

# pseudo_version REV: the version the go command gives $core at commit REV
# (a tag, or a pseudo-version), read in the environment of go_from_git.
pseudo_version() {
	local dir
	dir=$(mktemp -d)
	(cd "$dir" && go mod init example.com/probe >/dev/null 2>&1 && go list -m -f '{{.Version}}' "$core@$1")
	rm -rf "$dir"
}
