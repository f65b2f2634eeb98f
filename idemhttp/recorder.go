package idemhttp

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
)

// recorder is the ResponseWriter the handler of a protected request writes
// to. It buffers the response (status, its own header map, body) so that it
// can be stored before the client sees it, and so that a handler that panics
// has sent nothing. A response that cannot be buffered goes straight to the
// client and is not stored: one whose body passes the limit, one the handler
// flushes (streaming), one whose connection the handler hijacks.
type recorder struct {
	w      http.ResponseWriter
	header http.Header
	status int // 0 until the handler writes the header
	body   bytes.Buffer
	max    int
	// streamed says why the response went to the client as it was written
	// ("" while it is buffered).
	streamed string
	hijacked bool
}

var (
	_ http.Flusher  = (*recorder)(nil)
	_ http.Hijacker = (*recorder)(nil)
)

func newRecorder(w http.ResponseWriter, max int) *recorder {
	return &recorder{w: w, header: make(http.Header), max: max}
}

// Header returns the handler's header map. It starts empty: headers that
// middleware outside this one set on the real ResponseWriter stay there and
// are sent, but are neither visible here nor stored.
func (rw *recorder) Header() http.Header { return rw.header }

// WriteHeader records the status. As in net/http, a code outside 100-999
// panics and a second call is ignored. Informational (1xx) responses are
// dropped: the final response is buffered, and an early one would escape a
// handler that later panics.
func (rw *recorder) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if rw.status != 0 || rw.hijacked || code < 200 {
		return
	}
	rw.status = code
}

// Write buffers p, or sends it when the response is streamed. Crossing the
// body limit starts streaming.
func (rw *recorder) Write(p []byte) (int, error) {
	if rw.hijacked {
		return 0, http.ErrHijacked
	}
	if rw.status == 0 {
		rw.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(rw.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if rw.streamed == "" && rw.body.Len()+len(p) > rw.max {
		rw.stream(fmt.Sprintf("its body is larger than %d bytes", rw.max))
	}
	if rw.streamed != "" {
		return rw.w.Write(p)
	}
	return rw.body.Write(p)
}

// Flush sends what is buffered and streams the rest of the response: a
// handler that flushes wants its client to see the response as it is
// written, which a stored response cannot offer.
func (rw *recorder) Flush() {
	if rw.hijacked {
		return
	}
	if rw.status == 0 {
		rw.WriteHeader(http.StatusOK)
	}
	if rw.streamed == "" {
		rw.stream("the handler flushed it")
	}
	_ = http.NewResponseController(rw.w).Flush()
}

// Hijack hands the connection to the handler; nothing is stored.
func (rw *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(rw.w).Hijack()
	if err == nil {
		rw.hijacked = true
		rw.body.Reset()
	}
	return conn, brw, err
}

// Unwrap returns the ResponseWriter underneath, for http.ResponseController
// (deadlines, full duplex).
func (rw *recorder) Unwrap() http.ResponseWriter { return rw.w }

// stream sends the header and what is buffered, and makes later writes go
// straight to the client.
func (rw *recorder) stream(why string) {
	rw.streamed = why
	rw.sniff()
	copyHeader(rw.w.Header(), rw.header)
	rw.w.WriteHeader(rw.status)
	if rw.body.Len() > 0 {
		_, _ = rw.w.Write(rw.body.Bytes())
	}
	rw.body = bytes.Buffer{}
}

// sniff sets Content-Type as net/http would on the first write, so the
// stored response carries the type the client saw.
func (rw *recorder) sniff() {
	if _, ok := rw.header["Content-Type"]; ok || rw.body.Len() == 0 || !bodyAllowed(rw.status) {
		return
	}
	if rw.header.Get("Transfer-Encoding") != "" {
		return
	}
	rw.header.Set("Content-Type", http.DetectContentType(rw.body.Bytes()))
}

// result finishes the recording once the handler has returned.
func (rw *recorder) result() *response {
	if rw.status == 0 {
		rw.status = http.StatusOK
	}
	resp := &response{status: rw.status, header: rw.header}
	switch {
	case rw.hijacked:
		resp.sent, resp.unstorable = true, "the handler hijacked the connection"
	case rw.streamed != "":
		resp.sent, resp.unstorable = true, rw.streamed
	default:
		rw.sniff()
		resp.body = rw.body.Bytes()
	}
	return resp
}

// bodyAllowed reports whether a response with status may have a body
// (RFC 9110: not 1xx, 204 or 304).
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// copyHeader sets every header of src in dst, replacing dst's values.
func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = vs
	}
}
