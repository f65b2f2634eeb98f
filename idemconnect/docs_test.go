package idemconnect_test

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/idemkit/idempotency/idemconnect"
	"github.com/idemkit/idempotency/idemhttp"
)

// docTable returns the rows (cells trimmed, header and rule dropped) of the
// first table after the heading in docs/connect.md. It skips the test when
// the page is not there (the module outside this repository).
func docTable(t *testing.T, heading string) [][]string {
	t.Helper()
	b, err := os.ReadFile("../docs/connect.md")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("docs/connect.md is not beside the module")
	}
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("docs/connect.md has no %q", heading)
	}
	var rows [][]string
	for _, line := range strings.Split(rest, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			if len(rows) > 0 {
				break
			}
			continue
		}
		var cells []string
		for _, c := range strings.Split(strings.Trim(line, "|"), "|") {
			cells = append(cells, strings.TrimSpace(c))
		}
		rows = append(rows, cells)
	}
	if len(rows) < 3 {
		t.Fatalf("no table after %q in docs/connect.md", heading)
	}
	return rows[2:]
}

var backticked = regexp.MustCompile("`([^`]+)`")

// codeByName maps gRPC's names of the codes, which the page uses, to
// Connect's codes.
var codeByName = map[string]connect.Code{
	"OK": idemconnect.CodeOK, "Canceled": connect.CodeCanceled, "Unknown": connect.CodeUnknown,
	"InvalidArgument": connect.CodeInvalidArgument, "DeadlineExceeded": connect.CodeDeadlineExceeded,
	"NotFound": connect.CodeNotFound, "AlreadyExists": connect.CodeAlreadyExists,
	"PermissionDenied": connect.CodePermissionDenied, "ResourceExhausted": connect.CodeResourceExhausted,
	"FailedPrecondition": connect.CodeFailedPrecondition, "Aborted": connect.CodeAborted,
	"OutOfRange": connect.CodeOutOfRange, "Unimplemented": connect.CodeUnimplemented,
	"Internal": connect.CodeInternal, "Unavailable": connect.CodeUnavailable,
	"DataLoss": connect.CodeDataLoss, "Unauthenticated": connect.CodeUnauthenticated,
}

// TestDocStatusTable checks the refusals of the status code table of
// docs/connect.md — each row whose details name an ErrorInfo reason —
// against the refusals that TestRefusals provokes: the same reasons, the
// same codes, RetryInfo where the table says so.
func TestDocStatusTable(t *testing.T) {
	seen := map[string]bool{}
	for _, row := range docTable(t, "## Status codes") {
		m := regexp.MustCompile(`ErrorInfo ` + "`" + `(IDEMPOTENCY_[A-Z_]+)` + "`").FindStringSubmatch(row[2])
		if m == nil {
			continue
		}
		reason := m[1]
		seen[reason] = true
		rc, ok := refusals[reason]
		if !ok {
			t.Errorf("docs/connect.md names reason %s, which idemconnect does not have", reason)
			continue
		}
		if code, ok := codeByName[strings.Trim(row[0], "`")]; !ok || code != rc.code {
			t.Errorf("row %q: code %s, idemconnect refuses %s with %v", row[0], row[0], reason, rc.code)
		}
		if strings.Contains(row[2], "RetryInfo") != rc.retry {
			t.Errorf("row %q: RetryInfo %v in the table, %v in the code", row[0], !rc.retry, rc.retry)
		}
		if row[3] != "no" {
			t.Errorf("row %q: a refusal, but the handler ran: %q", row, row[3])
		}
	}
	for reason := range refusals {
		if !seen[reason] {
			t.Errorf("the status code table of docs/connect.md does not list %s", reason)
		}
	}
}

// TestDocStorePolicyTable checks the store policy table against
// DefaultStorePolicy: every code in exactly one column, the right one.
func TestDocStorePolicyTable(t *testing.T) {
	rows := docTable(t, "### The store policy")
	listed := map[connect.Code]int{}
	for col, stored := range []bool{true, false} {
		for _, m := range backticked.FindAllStringSubmatch(rows[0][col], -1) {
			code, ok := codeByName[m[1]]
			if !ok {
				continue // *connect.Error
			}
			listed[code]++
			if idemconnect.DefaultStorePolicy(code) != stored {
				t.Errorf("docs/connect.md: %v stored = %v, DefaultStorePolicy says %v", code, stored, !stored)
			}
		}
	}
	for _, c := range codeByName {
		if listed[c] != 1 {
			t.Errorf("docs/connect.md lists %v %d times in the store policy table, want once", c, listed[c])
		}
	}
}

// TestDocOperationTable checks the procedure → operation table.
func TestDocOperationTable(t *testing.T) {
	for _, row := range docTable(t, "## Operation names") {
		in, want := strings.Trim(row[0], "`"), strings.Trim(row[1], "`")
		if got := idemhttp.OperationName(in); got != want {
			t.Errorf("OperationName(%q) = %q, docs/connect.md says %q", in, got, want)
		}
	}
}

// TestDocOptionsTable checks that the options table lists every option of
// the package (the exported With functions), and no other.
func TestDocOptionsTable(t *testing.T) {
	var inDocs []string
	for _, row := range docTable(t, "## Options") {
		name, _, _ := strings.Cut(strings.Trim(row[0], "`"), "(")
		inDocs = append(inDocs, name)
	}
	fset := token.NewFileSet()
	var inCode []string
	files, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), ".go") || strings.HasSuffix(f.Name(), "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f.Name(), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "With") && fn.Name.IsExported() {
				inCode = append(inCode, fn.Name.Name)
			}
		}
	}
	slices.Sort(inDocs)
	slices.Sort(inCode)
	if !slices.Equal(inDocs, inCode) {
		t.Fatalf("options in docs/connect.md %q, in the code %q", inDocs, inCode)
	}
}
