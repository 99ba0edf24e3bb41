//! Wire values that are one of two shapes ("a string or an array"), as poem-openapi types
//! whose schema is a bare `anyOf` of the two. The `Union` derive also writes `type: object`
//! next to the `anyOf`, which no string or array satisfies, so these few are written here.

/// Declares an enum of two variants with `Type`, `ParseFromJSON` and `ToJSON`: the first
/// variant whose type parses the value wins.
macro_rules! either {
    ($(#[$doc:meta])* $name:ident as $oai:literal { $a:ident($ta:ty), $b:ident($tb:ty) $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, serde::Serialize)]
        #[serde(untagged)]
        pub enum $name {
            $a($ta),
            $b($tb),
        }

        impl poem_openapi::types::Type for $name {
            const IS_REQUIRED: bool = true;
            type RawValueType = Self;
            type RawElementValueType = Self;

            fn name() -> std::borrow::Cow<'static, str> {
                $oai.into()
            }

            fn schema_ref() -> poem_openapi::registry::MetaSchemaRef {
                poem_openapi::registry::MetaSchemaRef::Reference($oai.into())
            }

            fn register(registry: &mut poem_openapi::registry::Registry) {
                <$ta as poem_openapi::types::Type>::register(registry);
                <$tb as poem_openapi::types::Type>::register(registry);
                registry.create_schema::<Self, _>($oai.into(), |_| poem_openapi::registry::MetaSchema {
                    rust_typename: Some(std::any::type_name::<Self>()),
                    any_of: vec![
                        <$ta as poem_openapi::types::Type>::schema_ref(),
                        <$tb as poem_openapi::types::Type>::schema_ref(),
                    ],
                    ..poem_openapi::registry::MetaSchema::ANY
                });
            }

            fn as_raw_value(&self) -> Option<&Self::RawValueType> {
                Some(self)
            }

            fn raw_element_iter<'a>(
                &'a self,
            ) -> Box<dyn Iterator<Item = &'a Self::RawElementValueType> + 'a> {
                Box::new(self.as_raw_value().into_iter())
            }
        }

        impl poem_openapi::types::ParseFromJSON for $name {
            fn parse_from_json(
                value: Option<serde_json::Value>,
            ) -> poem_openapi::types::ParseResult<Self> {
                let value = value.unwrap_or_default();
                if let Ok(v) = <$ta as poem_openapi::types::ParseFromJSON>::parse_from_json(Some(value.clone())) {
                    return Ok(Self::$a(v));
                }
                match <$tb as poem_openapi::types::ParseFromJSON>::parse_from_json(Some(value.clone())) {
                    Ok(v) => Ok(Self::$b(v)),
                    Err(_) => Err(poem_openapi::types::ParseError::expected_type(value)),
                }
            }
        }

        impl poem_openapi::types::ToJSON for $name {
            fn to_json(&self) -> Option<serde_json::Value> {
                match self {
                    Self::$a(v) => poem_openapi::types::ToJSON::to_json(v),
                    Self::$b(v) => poem_openapi::types::ToJSON::to_json(v),
                }
            }
        }
    };
}

pub(crate) use either;
