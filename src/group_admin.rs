//! The admin methods every group handle has — an ordered [`Group`](crate::Group) and a
//! [`WorkGroup`](crate::WorkGroup) — written once: its name, committed offset and skipped
//! count, pausing and resuming it, deleting it. The handle type has `shared`, `queue` and
//! `name` fields and a `state()` lookup of its engine state (which has `durable` and `skipped`);
//! `$ctor` is the `Queue` method that makes it and `$example` a group name for the examples.

macro_rules! group_admin {
    ($ctor:literal, $example:literal) => {
        /// The group's name.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn demo(queue: rockq::Queue) -> Result<(), rockq::NameError> {
        #[doc = concat!("let group = queue.", $ctor, "(\"", $example, "\")?;")]
        #[doc = concat!("assert_eq!(group.name(), \"", $example, "\");")]
        /// # Ok(()) }
        /// ```
        pub fn name(&self) -> &str {
            &self.name
        }

        /// The committed offset: every message up to and including it is finished (acked or
        /// dead-lettered) and the record is durable. `None` if the group has never subscribed;
        /// 0 if nothing is committed yet.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
        #[doc = concat!("if let Some(offset) = queue.", $ctor, "(\"", $example, "\")?.committed() {")]
        ///     println!("done up to #{offset} ({} behind)", queue.last_seq() - offset);
        /// }
        /// # Ok(()) }
        /// ```
        pub fn committed(&self) -> Option<u64> {
            self.state().map(|g| g.durable.load(std::sync::atomic::Ordering::Acquire))
        }

        /// Messages this group never finished because retention deleted them first (since
        /// open).
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
        #[doc = concat!("let lost = queue.", $ctor, "(\"", $example, "\")?.skipped();")]
        /// if lost > 0 {
        ///     eprintln!("retention deleted {lost} messages before the group finished them");
        /// }
        /// # Ok(()) }
        /// ```
        pub fn skipped(&self) -> u64 {
            self.state().map_or(0, |g| g.skipped.load(std::sync::atomic::Ordering::Relaxed))
        }

        /// Pauses this group durably (see [`Broker::pause_group`](crate::Broker::pause_group)).
        ///
        /// # Errors
        ///
        /// [`Error::NoSuchGroup`](crate::Error::NoSuchGroup) if it never subscribed,
        /// [`Error::Shutdown`](crate::Error::Shutdown),
        /// [`Error::Storage`](crate::Error::Storage).
        ///
        /// # Cancel safety
        ///
        /// Cancel safe in effect: the group is paused or not.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
        #[doc = concat!("let group = queue.", $ctor, "(\"", $example, "\")?;")]
        /// group.pause().await?; // e.g. while what it calls is down
        /// assert!(group.is_paused());
        /// # Ok(()) }
        /// ```
        pub async fn pause(&self) -> Result<(), crate::error::Error> {
            self.shared.set_paused(&self.queue, &self.name, true).await
        }

        /// Resumes this group (see [`Broker::resume_group`](crate::Broker::resume_group)).
        ///
        /// # Errors
        ///
        /// As for `pause`.
        ///
        /// # Cancel safety
        ///
        /// Cancel safe in effect.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
        #[doc = concat!("let group = queue.", $ctor, "(\"", $example, "\")?;")]
        /// group.resume().await?;
        /// assert!(!group.is_paused());
        /// # Ok(()) }
        /// ```
        pub async fn resume(&self) -> Result<(), crate::error::Error> {
            self.shared.set_paused(&self.queue, &self.name, false).await
        }

        /// Whether this group is paused.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
        #[doc = concat!("if queue.", $ctor, "(\"", $example, "\")?.is_paused() {")]
        ///     println!("paused");
        /// }
        /// # Ok(()) }
        /// ```
        pub fn is_paused(&self) -> bool {
            self.shared.is_paused(&self.queue, &self.name)
        }

        /// Deletes this group with everything of it, as
        /// [`Broker::delete_group`](crate::Broker::delete_group) does; `false` if it does not
        /// exist (or its queue was deleted since this handle was made: a queue created again
        /// under the name is another queue, and its group of this name is left alone).
        ///
        /// # Errors
        ///
        /// [`Error::Shutdown`](crate::Error::Shutdown), [`Error::Storage`](crate::Error::Storage),
        /// [`Error::Failed`](crate::Error::Failed).
        ///
        /// # Cancel safety
        ///
        /// Cancel safe in effect: once the request reached the writer, the group is deleted
        /// whether or not the future is still awaited.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # async fn demo(queue: rockq::Queue) -> Result<(), rockq::Error> {
        #[doc = concat!("queue.", $ctor, "(\"retired\")?.delete().await?;")]
        /// # Ok(()) }
        /// ```
        pub async fn delete(&self) -> Result<bool, crate::error::Error> {
            if self.queue.is_deleted() {
                return Ok(false);
            }
            self.shared.delete_group(&self.queue.name, &self.name).await
        }
    };
}
pub(crate) use group_admin;
