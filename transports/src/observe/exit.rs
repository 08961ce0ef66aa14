//! How either binary ends: its error in one line ([`error_report`]) and its exit status
//! ([`exit_code`]).

/// The one line either binary prints for the error it stops with: `error`'s text, then
/// each cause's (`source()`) that the text before it does not already hold, joined by
/// `: `. edgebeat's errors put their cause in their own text for logs (`%error`) and
/// also return it as `source()`; printing the whole chain, as `anyhow`'s `{:?}` does,
/// would say every cause twice.
pub fn error_report(error: &(dyn std::error::Error + 'static)) -> String {
    let mut report = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !report.contains(&text) {
            report.push_str(": ");
            report.push_str(&text);
        }
        cause = c.source();
    }
    report
}

/// How either binary ends: status 0, or its error's [`error_report`] on standard error,
/// after `Error: `, and status 1.
pub fn exit_code<E: AsRef<dyn std::error::Error + 'static>>(
    result: Result<(), E>,
) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("Error: {}", error_report(error.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}
