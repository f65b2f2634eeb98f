package idemhttp

import (
	"encoding/json"
	"net/http"
)

// problemBase is where the problem types are explained.
const problemBase = "https://github.com/idemkit/idempotency/blob/main/docs/http.md#"

// The problem types of the middleware's error responses (RFC 9457 "type"
// members). Each points at its explanation in docs/http.md.
const (
	// ProblemKeyMissing (400): the route requires an Idempotency-Key header
	// (WithKeyRequired) and the request has none.
	ProblemKeyMissing = problemBase + "key-missing"
	// ProblemKeyInvalid (400): the Idempotency-Key header is malformed: not 1
	// to 255 visible ASCII characters, a broken quoted string, or sent twice.
	ProblemKeyInvalid = problemBase + "key-invalid"
	// ProblemCallerUnknown (401, with the WWW-Authenticate challenge of
	// WithAuthChallenge when set): the key scope hook (WithKeyScope) could
	// not tell whose request it is.
	ProblemCallerUnknown = problemBase + "caller-unknown"
	// ProblemBodyTooLarge (413): the request body is larger than
	// WithMaxBodyBytes allows.
	ProblemBodyTooLarge = problemBase + "body-too-large"
	// ProblemBodyUnreadable (400): the request body could not be read.
	ProblemBodyUnreadable = problemBase + "body-unreadable"
	// ProblemInProgress (409, with Retry-After): a request with this key is
	// still being processed.
	ProblemInProgress = problemBase + "in-progress"
	// ProblemKeyReuse (422): the key was used before for a different request.
	ProblemKeyReuse = problemBase + "key-reuse"
	// ProblemStoreUnavailable (503, with Retry-After): the idempotency store
	// failed and the coordinator is set to fail closed; the request was not
	// processed.
	ProblemStoreUnavailable = problemBase + "store-unavailable"
	// ProblemNotReplayable (409, without Retry-After): a request with this
	// key was processed, but its response could not be stored (streamed,
	// hijacked or too large), so it cannot be sent again; the handler does
	// not run again either. Retrying with the same key gets the same answer.
	ProblemNotReplayable = problemBase + "not-replayable"
)

// Problem is an error response of the middleware, in the shape of an RFC 9457
// problem details object. Type is one of the Problem* constants, or
// "about:blank" for errors that are not the client's (a misconfiguration, a
// cancelled request).
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Err is the underlying error, if any, for logging by a custom problem
	// writer. WriteProblem never sends it: it may hold internals.
	Err error `json:"-"`
}

// WriteProblem writes p as application/problem+json with status p.Status,
// marked not to be cached. It is the default problem writer (see
// WithProblemWriter).
func WriteProblem(w http.ResponseWriter, p Problem) {
	b, err := json.Marshal(p)
	if err != nil { // cannot happen: every field is a string or an int
		b = []byte(`{"type":"about:blank","title":"Internal Server Error","status":500}`)
		p.Status = http.StatusInternalServerError
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(b, '\n'))
}

// problem returns the Problem of type typ. Titles summarise the type, as RFC
// 9457 asks; "about:blank" problems take the status text.
func problem(typ string, status int, detail string, err error) Problem {
	title := http.StatusText(status)
	switch typ {
	case ProblemKeyMissing:
		title = "Idempotency-Key header missing"
	case ProblemKeyInvalid:
		title = "Idempotency-Key header invalid"
	case ProblemCallerUnknown:
		title = "Caller unknown"
	case ProblemBodyTooLarge:
		title = "Request body too large"
	case ProblemBodyUnreadable:
		title = "Request body unreadable"
	case ProblemInProgress:
		title = "Request in progress"
	case ProblemKeyReuse:
		title = "Idempotency-Key reused"
	case ProblemStoreUnavailable:
		title = "Idempotency store unavailable"
	case ProblemNotReplayable:
		title = "Response not replayable"
	}
	return Problem{Type: typ, Title: title, Status: status, Detail: detail, Err: err}
}
