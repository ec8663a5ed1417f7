"""The errors trainsup raises, one class per status code of the C++ library (trainsup/status.h),
so that callers catch by type, not by searching messages. Each is a RuntimeError (what earlier
releases raised) and also the built-in exception closest to its meaning:

  InvalidArgumentError  ValueError       a setting, argument or state that does not fit
  NotFoundError         LookupError      a file, checkpoint or key that is not there
  IoError               OSError          the disk or the network failed
  CorruptionError       -                data that fails its checksum or format
  TimedOutError         TimeoutError     a wait ran out
  UnavailableError      ConnectionError  a service (store, coordinator, device) is not there
  InternalError         -                a bug in trainsup: please report it

`code` on each class (and instance) is the C++ code's name, e.g. "Corruption".
"""


from typing import Dict, Type

__all__ = ["Error", "InvalidArgumentError", "NotFoundError", "IoError", "CorruptionError", "TimedOutError",
           "UnavailableError", "InternalError", "BY_CODE"]


class Error(RuntimeError):
    code = "Error"


class InvalidArgumentError(Error, ValueError):
    code = "InvalidArgument"


class NotFoundError(Error, LookupError):
    code = "NotFound"


class IoError(Error, OSError):
    code = "IoError"


class CorruptionError(Error):
    code = "Corruption"


class TimedOutError(Error, TimeoutError):
    code = "TimedOut"


class UnavailableError(Error, ConnectionError):
    code = "Unavailable"


class InternalError(Error):
    code = "Internal"


BY_CODE: Dict[str, Type[Error]] = {cls.code: cls for cls in (InvalidArgumentError, NotFoundError, IoError, CorruptionError, TimedOutError,
                                     UnavailableError, InternalError)}
