#!/usr/bin/env bash
# Runs the install lines of each nested module's page, as written, in a new
# module beside a clone of this repository, and builds a program that imports
# the module: the install each page gives works today. `make
# install-commands` runs it, and so CI does. A page whose install block is
# missing, or that names another module, fails it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
GO=${GO:-go}

# page, module (its directory), and an exported name of its package that the
# program uses.
pages=(
	"docs/gin.md idemgin Middleware"
	"docs/echo.md idemecho Middleware"
	"docs/grpc.md idemgrpc ContextWithKey"
	"docs/connect.md idemconnect ContextWithKey"
	"docs/consumers.md idemwatermill IsDeadLetter"
	"docs/stores.md idempg SchemaVersion"
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The page's ../idempotency: a clone of this repository next to the module.
ln -s "$root" "$tmp/idempotency"

for entry in "${pages[@]}"; do
	read -r page mod name <<<"$entry"
	# The sh block of the page that replaces this module.
	lines=$(python3 - "$page" "$mod" <<'PY'
import re, sys
page, mod = sys.argv[1], sys.argv[2]
blocks = re.findall(r"```sh\n(.*?)```", open(page).read(), re.S)
mine = [b for b in blocks if "github.com/idemkit/idempotency/" + mod + "=" in b]
if len(mine) != 1:
    sys.exit(f"{page}: {len(mine)} sh blocks replace {mod}, want 1")
print(mine[0], end="")
PY
)
	app="$tmp/app-$mod"
	mkdir "$app"
	(
		cd "$app"
		# A user's network: no module proxy serves idemkit's modules.
		$GO mod init example.com/install >/dev/null 2>&1
		cat >main.go <<GO
package main

import (
	"fmt"

	"github.com/idemkit/idempotency/$mod"
)

func main() { fmt.Println($mod.$name) }
GO
		while IFS= read -r line; do
			cmd=$(printf '%s' "${line%%#*}" | sed 's/[[:space:]]*$//')
			[ -n "$cmd" ] || continue
			echo ">>> $page: $cmd"
			bash -c "$cmd"
		done <<<"$lines"
		$GO build -o /dev/null .
	)
	echo "ok: $page installs $mod, and a program importing it builds"
done
