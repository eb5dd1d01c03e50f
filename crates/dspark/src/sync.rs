//! Locks that refuse re-entry: [`Held`] is a mutex guard that knows its thread holds it, so a
//! second lock of the same mutex from the same thread (a callback calling back into the call
//! that runs it) is a typed `invalid-argument` error instead of a deadlock. Other threads wait
//! their turn as with any mutex.

use std::sync::{Mutex, MutexGuard};

use crate::error::{Error, Result};

thread_local! {
    /// The locks this thread holds through [`Held`] (their addresses).
    static HELD: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A mutex guard that knows its thread holds it, so that a re-entrant lock of the same mutex
/// from the same thread is a typed error, not a deadlock.
pub struct Held<'a, E> {
    guard: MutexGuard<'a, E>,
    at: usize,
}

impl<'a, E> Held<'a, E> {
    /// Lock `m` (named `what` in errors) for this thread.
    pub fn lock(m: &'a Mutex<E>, what: &str) -> Result<Self> {
        let at = std::ptr::from_ref(m) as usize;
        if HELD.with(|h| h.borrow().contains(&at)) {
            return Err(Error::invalid(
                what,
                format!(
                    "re-entrant call: this thread is already inside a call of this {what} \
                     (e.g. from its on_round hook); call it after that call returns"
                ),
            ));
        }
        let guard = m.lock().map_err(|_| Error::Internal {
            message: format!("the {what}'s engine lock is poisoned"),
        })?;
        HELD.with(|h| h.borrow_mut().push(at));
        Ok(Held { guard, at })
    }
}

impl<E> Drop for Held<'_, E> {
    fn drop(&mut self) {
        let at = self.at;
        HELD.with(|h| h.borrow_mut().retain(|&x| x != at));
    }
}

impl<E> std::ops::Deref for Held<'_, E> {
    type Target = E;
    fn deref(&self) -> &E {
        &self.guard
    }
}

impl<E> std::ops::DerefMut for Held<'_, E> {
    fn deref_mut(&mut self) -> &mut E {
        &mut self.guard
    }
}
