// Package faultstore wraps a [idemstore.Store] in one that fails on demand,
// for tests of what code built on the coordinator does when its store fails.
//
// [Wrap] returns a [Store] that passes every call through to the inner store
// until told otherwise. Per method, it can fail every call ([Store.Fail]),
// the next call ([Store.FailOnce]) or the next n calls ([Store.FailTimes]),
// with a chosen error or [ErrInjected]; run a [Hook] before each call of a
// method ([Store.Before]), to delay it, to change the inner store between two
// steps, or to fail only some calls; and count the calls of each method
// ([Store.Calls]):
//
//	inner := memstore.New()
//	store := faultstore.Wrap(inner)
//	store.FailOnce(idemevent.MethodComplete, nil) // saving the result fails
//
// A call that fails does not reach the inner store: a failed Reserve reserved
// nothing, a failed Complete stored nothing. That is the failure a client
// sees when the request never got to the server. For a reply lost on its way
// back, where the step was done but the caller is told it failed, use
// [Store.LoseReplies].
package faultstore
