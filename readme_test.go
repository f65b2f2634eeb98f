package idempotency_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// Every command in the README's sh blocks must be one that
// tools/readme-commands.sh runs (CI runs that script), so a README command
// cannot silently stop working.
func TestReadmeCommandsAreChecked(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile("tools/readme-commands.sh")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) < 2 {
		t.Fatalf("found %d sh blocks in README.md; expected the install command and the two commands", len(blocks))
	}
	checked := 0
	for _, b := range blocks {
		for _, line := range strings.Split(b[1], "\n") {
			cmd := strings.TrimSpace(strings.SplitN(line, "#", 2)[0])
			if cmd == "" {
				continue
			}
			if !strings.Contains(string(script), `echo ">>> `+cmd+`"`) {
				t.Errorf("README command %q is not run by tools/readme-commands.sh", cmd)
			}
			checked++
		}
	}
	t.Logf("%d README commands are checked", checked)
}
