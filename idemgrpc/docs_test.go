package idemgrpc_test

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/idemhttp"
)

// docTable returns the rows (cells trimmed, header and rule dropped) of the
// first table after the heading in docs/grpc.md. It skips the test when the
// page is not there (the module outside this repository).
func docTable(t *testing.T, heading string) [][]string {
	t.Helper()
	b, err := os.ReadFile("../docs/grpc.md")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("docs/grpc.md is not beside the module")
	}
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("docs/grpc.md has no %q", heading)
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
		t.Fatalf("no table after %q in docs/grpc.md", heading)
	}
	return rows[2:]
}

var backticked = regexp.MustCompile("`([^`]+)`")

// codeByName maps the names of codes.Code's String to the codes.
func codeByName() map[string]codes.Code {
	m := map[string]codes.Code{}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		m[c.String()] = c
	}
	return m
}

// TestDocStatusTable walks the refusals of the status code table in
// docs/grpc.md — each row whose details name an ErrorInfo reason — provokes
// each one, and checks its code, whether it carries RetryInfo, and that the
// handler did not run.
func TestDocStatusTable(t *testing.T) {
	byName := codeByName()
	provoke := map[string]func(t *testing.T) (*payments, error){
		idemgrpc.ReasonKeyMissing: func(t *testing.T) (*payments, error) {
			c, _ := newCoordinator(t, nil)
			svc := &payments{}
			return svc, charge(t.Context(), serve(t, c, svc, []idemgrpc.Option{idemgrpc.WithKeyRequired(true)}), chargeReq(1)).err
		},
		idemgrpc.ReasonKeyInvalid: func(t *testing.T) (*payments, error) {
			c, _ := newCoordinator(t, nil)
			svc := &payments{}
			return svc, charge(withKey(t, "a b"), serve(t, c, svc, nil), chargeReq(1)).err
		},
		idemgrpc.ReasonCallerUnknown: func(t *testing.T) (*payments, error) {
			c, _ := newCoordinator(t, nil)
			svc := &payments{}
			scope := idemgrpc.WithKeyScope(func(context.Context) (string, error) { return "", errors.New("who?") })
			return svc, charge(withKey(t, "k"), serve(t, c, svc, []idemgrpc.Option{scope}), chargeReq(1)).err
		},
		idemgrpc.ReasonInProgress: func(t *testing.T) (*payments, error) {
			c, _ := newCoordinator(t, nil, coordinator.WithInFlight(coordinator.InFlightRaise))
			started, release := make(chan struct{}), make(chan struct{})
			svc := &payments{fail: func(context.Context, int64) error {
				close(started)
				<-release
				return nil
			}}
			client := serve(t, c, svc, nil)
			done := make(chan reply)
			go func() { done <- charge(withKey(t, "k"), client, chargeReq(1)) }()
			<-started
			err := charge(withKey(t, "k"), client, chargeReq(1)).err
			close(release)
			<-done
			svc.runs.Add(-1) // the first call's run
			return svc, err
		},
		idemgrpc.ReasonKeyReuse: func(t *testing.T) (*payments, error) {
			c, _ := newCoordinator(t, nil)
			svc := &payments{}
			client := serve(t, c, svc, nil)
			charge(withKey(t, "k"), client, chargeReq(1))
			err := charge(withKey(t, "k"), client, chargeReq(2)).err
			svc.runs.Add(-1)
			return svc, err
		},
		idemgrpc.ReasonNotReplayable: func(t *testing.T) (*payments, error) {
			c, _ := newCoordinator(t, nil, coordinator.WithMaxResultBytes(16))
			svc := &payments{}
			client := serve(t, c, svc, nil)
			charge(withKey(t, "k"), client, chargeReq(1))
			err := charge(withKey(t, "k"), client, chargeReq(1)).err
			svc.runs.Add(-1)
			return svc, err
		},
		idemgrpc.ReasonStoreUnavailable: func(t *testing.T) (*payments, error) {
			c, _ := newCoordinator(t, faultyStore(), coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
			svc := &payments{}
			return svc, charge(withKey(t, "k"), serve(t, c, svc, nil), chargeReq(1)).err
		},
	}
	seen := map[string]bool{}
	for _, row := range docTable(t, "## Status codes") {
		m := regexp.MustCompile(`ErrorInfo ` + "`" + `(IDEMPOTENCY_[A-Z_]+)` + "`").FindStringSubmatch(row[2])
		if m == nil {
			continue
		}
		reason := m[1]
		code, ok := byName[strings.Trim(row[0], "`")]
		if !ok {
			t.Errorf("row %q: %s is not a code", row, row[0])
			continue
		}
		if row[3] != "no" {
			t.Errorf("row %q: a refusal, but the handler ran: %q", row, row[3])
		}
		seen[reason] = true
		t.Run(reason, func(t *testing.T) {
			p, ok := provoke[reason]
			if !ok {
				t.Fatalf("docs/grpc.md names reason %s, which idemgrpc does not have", reason)
			}
			svc, err := p(t)
			st := wantRefusal(t, err, code, reason)
			if strings.Contains(row[2], "RetryInfo") {
				retryInfo(t, st)
			} else if hasRetryInfo(st) {
				t.Errorf("%s carries a RetryInfo the table does not list", reason)
			}
			if svc.n() != 0 {
				t.Errorf("the handler ran %d times", svc.n())
			}
		})
	}
	for reason := range provoke {
		if !seen[reason] {
			t.Errorf("the status code table of docs/grpc.md does not list %s", reason)
		}
	}
}

// TestDocStorePolicyTable checks the store policy table of docs/grpc.md
// against DefaultStorePolicy: every code in exactly one column, the right
// one.
func TestDocStorePolicyTable(t *testing.T) {
	byName := codeByName()
	rows := docTable(t, "### The store policy")
	listed := map[codes.Code]int{}
	for col, stored := range []bool{true, false} {
		for _, m := range backticked.FindAllStringSubmatch(rows[0][col], -1) {
			code, ok := byName[m[1]]
			if !ok {
				t.Errorf("%q is not a code", m[1])
				continue
			}
			listed[code]++
			if idemgrpc.DefaultStorePolicy(code) != stored {
				t.Errorf("docs/grpc.md: %v stored = %v, DefaultStorePolicy says %v", code, stored, !stored)
			}
		}
	}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if listed[c] != 1 {
			t.Errorf("docs/grpc.md lists %v %d times in the store policy table, want once", c, listed[c])
		}
	}
}

// TestDocOperationTable checks the full method → operation table.
func TestDocOperationTable(t *testing.T) {
	for _, row := range docTable(t, "## Operation names") {
		in, want := strings.Trim(row[0], "`"), strings.Trim(row[1], "`")
		if got := idemhttp.OperationName(in); got != want {
			t.Errorf("OperationName(%q) = %q, docs/grpc.md says %q", in, got, want)
		}
	}
}

// TestDocOptionsTable checks that the options table of docs/grpc.md lists
// every option of the package (the exported With functions), and no other.
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
		t.Fatalf("options in docs/grpc.md %q, in the code %q", inDocs, inCode)
	}
}

// hasRetryInfo reports whether st carries a RetryInfo detail.
func hasRetryInfo(st *status.Status) bool {
	return slices.ContainsFunc(st.Details(), func(d any) bool { _, ok := d.(*errdetails.RetryInfo); return ok })
}

// TestEveryExportedNameHasAnExample checks that example_test.go has an
// Example for every exported name of the package, which godoc shows beside
// it, and that each has an Output comment, so that go test runs it.
func TestEveryExportedNameHasAnExample(t *testing.T) {
	fset := token.NewFileSet()
	files, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), ".go") || strings.HasSuffix(f.Name(), "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f.Name(), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for name, obj := range file.Scope.Objects {
			if ast.IsExported(name) && obj.Kind != ast.Bad {
				exported[name] = true
			}
		}
	}
	file, err := parser.ParseFile(fset, "example_test.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	examples := map[string]bool{}
	for _, d := range file.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || !strings.HasPrefix(fn.Name.Name, "Example") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(fn.Name.Name, "Example"), "_")
		examples[name] = true
		hasOutput := false
		for _, c := range file.Comments {
			if fn.Body.Pos() <= c.Pos() && c.End() <= fn.Body.End() && strings.HasPrefix(c.List[0].Text, "// Output:") {
				hasOutput = true
			}
		}
		if !hasOutput {
			t.Errorf("%s has no Output comment: go test compiles it but does not run it", fn.Name.Name)
		}
	}
	for name := range exported {
		if !examples[name] {
			t.Errorf("no Example%s", name)
		}
	}
}
