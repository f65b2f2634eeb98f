package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docsCheckSample matches the sample of check in docs/cli.md, which claims
// to be this commit's output: its command's URL, and its settings up to the
// blank line.
var docsCheckSample = regexp.MustCompile("(?s)\n\\$ IDEMPOTENCY_REDIS_URL='([^']+)' idemctl check\n(Settings:\n.*?\n)\n")

// The settings that docs/cli.md's sample of check lists are those that
// printSettings prints for its command, in order, with the same values and
// sources, the password masked: a setting added to Settings or idempg's
// Settings fails this test until the sample has it.
func TestDocsCheckSampleIsThisCommits(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := docsCheckSample.FindSubmatch(doc)
	if m == nil {
		t.Fatalf("docs/cli.md has no sample of check that %s matches", docsCheckSample)
	}
	setEnv(t, map[string]string{"IDEMPOTENCY_REDIS_URL": string(m[1])})
	s, err := (&overrides{}).settings()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	(&app{stdout: &out}).printSettings(s, &overrides{})
	if got, want := out.String(), string(m[2]); got != want {
		t.Errorf("docs/cli.md's sample of check says\n%s\nthis commit's idemctl prints\n%s", want, got)
	}
	if strings.Contains(string(m[2]), "s3cr3t") || !strings.Contains(string(m[2]), ":xxxxx@") {
		t.Errorf("the sample does not show the password masked:\n%s", m[2])
	}
}
